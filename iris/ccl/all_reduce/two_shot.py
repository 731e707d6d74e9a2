"""all_reduce's two_shot variant: member i reduces slice i (reading it from every member, its own first) and
writes the result into every member's output. Each element is read and written W times in total, not per
rank: the choice for large messages; in place too. Two members may move the halves by writes
(:func:`writes_halves`).

Example:
    >>> ctx.ccl.all_reduce(x, x, config=Config(all_reduce_variant="two_shot"))   # in place
"""

from __future__ import annotations

import triton

from iris.ccl import _common
from iris.ccl.all_reduce import kernel
from iris.ccl.all_reduce.variant import Variant
from iris.config import two_shot_writes


def writes_halves(members: int, in_place: bool, fused: bool, across_nodes: bool = False) -> bool:
    """Whether two_shot moves the halves by writes: two members, a separate output, not fused (or on two nodes,
    where fused reads go through the transport), IRIS_TWO_SHOT_WRITES on. Each member writes the other's half
    into the other's output, then combines its own half with what landed and writes both outputs: all
    writes, which keep the link's rate both ways where reads do not (benchmarks/probes/bidirectional_probe.py).
    """
    return members == 2 and not in_place and (across_nodes or not fused) and two_shot_writes()


def launch(ctx, output, input, op, config, workspace, async_op: bool) -> list:
    fuse = _common.fuse(config, input.nbytes)
    pieces = triton.cdiv(triton.cdiv(input.numel(), config.block_size), workspace.members.size)
    in_place = output.data_ptr() == input.data_ptr()
    if writes_halves(workspace.members.size, in_place, fuse, workspace.across_nodes):
        # no barrier after the writes' kernel: the sums' launch starts with one
        return (kernel.launch(ctx, output, input, op, config, workspace, True, "write_halves", pieces, False)
                + kernel.launch(ctx, output, input, op, config, workspace, async_op, "sum_written", pieces, False))
    return kernel.launch(ctx, output, input, op, config, workspace, async_op, "two_shot", pieces, fuse)


TWO_SHOT = Variant("two_shot", launch, in_place=True)
