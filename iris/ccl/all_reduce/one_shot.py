"""all_reduce's one_shot variant: each member reads every member's whole input and reduces it, in member order
(the same bits everywhere). One pass: the fastest for small messages; not in place (others still read).

Example:
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="one_shot"))
"""

from __future__ import annotations

import triton

from iris.ccl import _common
from iris.ccl.all_reduce import kernel
from iris.ccl.all_reduce.variant import Variant


def launch(ctx, output, input, op, config, workspace, async_op: bool) -> list:
    return kernel.launch(ctx, output, input, op, config, workspace, async_op, "one_shot",
                         triton.cdiv(input.numel(), config.block_size), _common.fuse(config, input.nbytes))


ONE_SHOT = Variant("one_shot", launch, local_output=True)
