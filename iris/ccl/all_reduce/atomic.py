"""all_reduce's atomic variant: each member seeds its output with its input, then atomically combines its input
into every other member's output (SUM where the backend's atomics allow the dtype, MAX and MIN on float32
and int32). One launch (seeded before the barrier), not in place; floats round in arrival order.

Example:
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="atomic"))
"""

from __future__ import annotations

import torch
import triton

from iris.ccl.all_reduce import kernel
from iris.ccl.all_reduce.variant import Variant
from iris.ccl.config import ReduceOp


def check(ctx, dtype, op) -> None:
    """Refuses, before any launch, a ``dtype`` and ``op`` the backend's atomics cannot do."""
    if op is not ReduceOp.SUM and dtype not in (torch.float32, torch.int32):
        raise TypeError(f"all_reduce: the atomic variant does {op.name} on float32 and int32 only, not "
                        f"{str(dtype).removeprefix('torch.')}; use another variant")
    row = ctx.backend.find_limitation("atomic", dtype, concurrent=True)
    if row is not None:
        raise TypeError(f"all_reduce: the atomic variant cannot add {row.dtype} on the {row.backend} backend: "
                        f"{row.reason}; use another variant")


def launch(ctx, output, input, op, config, workspace, async_op: bool) -> list:
    check(ctx, input.dtype, op)
    return kernel.launch(ctx, output, input, op, config, workspace, async_op, "atomic",
                         triton.cdiv(input.numel(), config.block_size), True)


ATOMIC = Variant("atomic", launch, fused_only=True,
                 far_path_refusal="one remote atomic per element: hundreds of times the default's time and more")
