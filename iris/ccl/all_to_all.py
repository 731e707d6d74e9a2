"""all_to_all over (M, W*N) tensors: column chunk j of member i's input lands as column chunk i of member j's output.

Two variants (``Config.all_to_all_variant``): "persistent", a kernel whose programs store every tile into its
member's output, and "copies", one 2-D copy-engine copy per member (the column chunk, row by row, into that
member's heap) between two barriers of the group: no SM moves data, so a kernel beside it keeps them all.

Example:
    >>> out = ctx.empty(4096, 1024 * ctx.get_num_ranks())
    >>> ctx.ccl.all_to_all(out, x, config=iris.ccl.Config(all_to_all_variant="copies"))
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.device import rma, tracing
from iris.ccl import _common
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes
from iris.memory.reserved import Region, declare

# all_to_all_v's table (iris.ccl.all_to_all_v): each rank's (rows, first row), written by a call's members before
# it reads them. Declared here until all_to_all_v's own module declares it.
A2AV_TABLE = declare(Region("ccl.a2av_table", 2, torch.int64, order=70, per_rank=True, lifetime="call"))


@triton.jit
def _all_to_all_piece(pid, trace, src, dst, rows, width, column_blocks, members, count, index, cur, heap_bases,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    span = trace.start(tracing.PUT, cur, -1, dst, pid // column_blocks, pid % column_blocks,
                       elements_bytes(dst, count * BLOCK_M * BLOCK_N))
    r = tl.cast(pid // column_blocks, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    c = (pid % column_blocks) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (r < rows)[:, None] & (c < width)[None, :]
    stride = width * count  # both tensors are (rows, count * width), contiguous
    for i in range(0, count):
        j = (index + i) % count  # start at a different peer on every rank
        peer = tl.load(members + j)
        data = tl.load(src + r[:, None] * stride + (j * width + c)[None, :], mask=mask)
        rma.store(dst + r[:, None] * stride + (index * width + c)[None, :], data, cur, peer, heap_bases, mask=mask)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_to_all_kernel(src, dst, rows, width, column_blocks, members, count, index, cur, heap_bases, arrivals,
                       expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr,
                       WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr):
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _all_to_all_piece(pid, trace, src, dst, rows, width, column_blocks, members, count, index, cur, heap_bases,
                          BLOCK_M, BLOCK_N)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def all_to_all(output, input, ctx, group=None, async_op=False, config=None):
    """Member i's columns ``[j*N, (j+1)*N)`` of ``input`` land in member j's columns ``[i*N, (i+1)*N)`` of ``output``.

    Args:
        output: (M, W*N) on the symmetric heap; W = group size.
        input: (M, W*N), any device tensor of this rank.
        ctx, group, async_op: as for :func:`iris.ccl.all_gather.all_gather`.
        config: an :class:`iris.ccl.Config` (``block_size_m``, ``block_size_n``).

    Example:
        >>> world = ctx.get_num_ranks()
        >>> out = ctx.empty(256, 64 * world)
        >>> ctx.ccl.all_to_all(out, ctx.randn(256, 64 * world))
    """
    config = _common.config_or_default(config)
    what = "all_to_all"
    ctx.team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=False)
    ctx.team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=True)
    members = ctx.team.participants(group)
    if (input.dim() != 2 or output.shape != input.shape or output.dtype != input.dtype
            or input.shape[1] % members.size):
        raise ValueError(f"{what}: input and output must both be (M, {members.size}*N) of one dtype; got input "
                         f"{tuple(input.shape)} {input.dtype}, output {tuple(output.shape)} {output.dtype}")
    rows, width = input.shape[0], input.shape[1] // members.size
    if config.all_to_all_variant == "copies":
        return _by_copies(ctx, output, input, members, group, async_op, rows, width)
    column_blocks = triton.cdiv(width, config.block_size_n)
    programs = triton.cdiv(rows, config.block_size_m) * column_blocks if rows and width else 0
    return _common.run(ctx, group, async_op, _common.fuse(config, input.nbytes), _all_to_all_kernel, programs,
                       input, output, rows, width, column_blocks, members.tensor, members.size, members.index,
                       ctx.get_rank(), ctx.get_heap_bases(), BLOCK_M=config.block_size_m, BLOCK_N=config.block_size_n)


def _by_copies(ctx, output, input, members, group, async_op: bool, rows: int, width: int) -> list:
    """The "copies" variant of checked tensors (see :func:`iris.ccl._common.run_copies`)."""
    heap, index, copy_rows = ctx.team.heap, members.index, ctx.backend.copy_rows
    chunk = width * input.element_size()  # bytes of a row of one column chunk
    pitch = chunk * members.size  # bytes of a whole row, in both tensors (contiguous)

    def send(output, input) -> None:  # chunk j of the input into chunk ``index`` of member j's output
        if not rows or not chunk:
            return
        for step in range(members.size):
            j = (index + step) % members.size  # a different first peer on every member
            copy_rows(heap.peer_address(output.data_ptr() + index * chunk, members.ranks[j]), pitch,
                      input.data_ptr() + j * chunk, pitch, chunk, rows)

    return _common.run_copies(ctx, "all_to_all", members, group, async_op, send, output, input)
