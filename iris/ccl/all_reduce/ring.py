"""all_reduce's ring variant: chunks pass around the ring (i sends to i + 1) in W - 1 reduce and W - 1 gather
steps, each a store into the neighbour's output and a flag: a member reads only its own memory. Declares
its flags (a counter per program the left neighbour adds to) and counts (what each program has seen).

Example:
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="ring"))
"""

from __future__ import annotations

import torch
import triton

from iris.ccl.all_reduce import kernel
from iris.ccl.all_reduce.variant import Variant
from iris.device.barrier import FUSED_PROGRAMS
from iris.memory.reserved import Region, declare

REGIONS = declare(Region("ccl.ring_flags", FUSED_PROGRAMS, torch.int64, order=20),
                  Region("ccl.ring_counts", FUSED_PROGRAMS, torch.int64, on_heap=False))


def launch(ctx, output, input, op, config, workspace, async_op: bool) -> list:
    chunk = triton.cdiv(input.numel(), workspace.members.size)  # each member's share
    return kernel.launch(ctx, output, input, op, config, workspace, async_op, "ring",
                         triton.cdiv(chunk, config.block_size), True)


RING = Variant("ring", launch, fused_only=True,
               far_path_refusal="a flag round trip to the next member per block and step: several times the "
                                "default's time")
