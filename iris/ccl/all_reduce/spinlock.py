"""all_reduce's spinlock variant: as atomic, but each update is a read-modify-write of a block under a lock word
on the receiving member (any dtype and op). Declares the lock words: block b's is word b % LOCK_WORDS.

Example:
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="spinlock"))
"""

from __future__ import annotations

import torch
import triton

from iris.ccl.all_reduce import kernel
from iris.ccl.all_reduce.variant import Variant
from iris.memory.reserved import Region, declare

LOCKS = declare(Region("ccl.locks", kernel.LOCK_WORDS.value, torch.int32, order=10))


def launch(ctx, output, input, op, config, workspace, async_op: bool) -> list:
    return kernel.launch(ctx, output, input, op, config, workspace, async_op, "spinlock",
                         triton.cdiv(input.numel(), config.block_size), True)


SPINLOCK = Variant("spinlock", launch, fused_only=True,
                   far_path_refusal="a remote lock and element-wise remote reads and writes per tile: over ten times "
                                    "the default's time")
