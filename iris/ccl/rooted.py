"""The collectives with a root: ``reduce`` (to ``dst``), ``gather`` (to ``dst``) and ``scatter`` (from ``src``).

torch.distributed's layouts with the blocks stacked along dim 0 (``gather``'s output and ``scatter``'s input
(W*M, N), member i's block the i-th), inside the group's barriers; ``dst`` and ``src`` are global ranks. The
tensors another member reaches are on the heap, the same shape on each member (``reduce``'s input,
``gather``'s output, ``scatter``'s output); the rest may be any device tensor.

Example:
    >>> x = ctx.full((4096,), float(ctx.get_rank() + 1))
    >>> ctx.ccl.reduce(x, dst=0)                            # in place: rank 0's x holds the sum
    >>> out = ctx.zeros(ctx.get_num_ranks() * 128, 64)
    >>> ctx.ccl.gather(out, torch.ones(128, 64, device=ctx.get_device()), dst=1)
    >>> mine = ctx.zeros(128, 64)
    >>> ctx.ccl.scatter(mine, out, src=1)                  # rank 1's out, block by block
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris.ccl import _common
from iris.ccl.all_gather import piece_of_repeat
from iris.ccl.config import ReduceOp
from iris.ccl.reduce_scatter import _accumulator, _reduce_scatter_kernel
from iris.device import rma, tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes


@triton.jit
def _gather_piece(pid, trace, src, dst, numel, root, index, cur, heap_bases, BLOCK: tl.constexpr):
    span = trace.start(tracing.PUT, cur, root, dst, pid, -1, elements_bytes(dst, BLOCK))
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    data = tl.load(src + offs, mask=mask)
    rma.store(dst + tl.cast(index, tl.int64) * numel + offs, data, cur, root, heap_bases, mask=mask)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _gather_kernel(src, dst, numel, root, members, count, index, cur, heap_bases, arrivals, expected, programs,
                   FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                   BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, BLOCK: tl.constexpr):
    """This member's ``numel`` elements of ``src`` into ``dst + index * numel`` of rank ``root``."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _gather_piece(pid, trace, src, dst, numel, root, index, cur, heap_bases, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


@triton.jit
def _scatter_piece(pid, trace, src, dst, numel, members, count, cur, heap_bases, BLOCK: tl.constexpr):
    place, offs = piece_of_repeat(pid, numel, BLOCK)  # the block of the member at ``place``, its piece
    peer = tl.load(members + place)
    span = trace.start(tracing.PUT, cur, peer, dst, pid, -1, elements_bytes(dst, BLOCK))
    mask = offs < numel
    data = tl.load(src + place * numel + offs, mask=mask)
    rma.store(dst + offs, data, cur, peer, heap_bases, mask=mask)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _scatter_kernel(src, dst, numel, members, count, cur, heap_bases, arrivals, expected, programs,
                    FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                    BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, BLOCK: tl.constexpr):
    """On the root (``programs`` > 0): block i of ``src`` (``numel`` elements) into ``dst`` of member i."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _scatter_piece(pid, trace, src, dst, numel, members, count, cur, heap_bases, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def _checked(ctx, what: str, root_name: str, root, output, input, group, config, dtypes, input_on_heap: bool):
    """A rooted call's config and members, its tensors and root checked (before any launch): ``input`` on the heap
    where ``input_on_heap`` (reduce: the members read it), else ``output`` (gather, scatter: written remotely)."""
    config = _common.config_or_default(config)
    ctx.team.check_tensor(what, "input", input, dtypes, symmetric=input_on_heap)
    ctx.team.check_tensor(what, "output", output, dtypes, symmetric=not input_on_heap)
    members = ctx.team.participants(group)
    if not isinstance(root, int) or isinstance(root, bool) or root not in members.ranks:
        raise ValueError(f"{what}: {root_name}={root!r} is not a member of the group {list(members.ranks)} (a global "
                         f"rank)")
    return config, members


def _stacked(what: str, whole, whole_name: str, block, block_name: str, size: int) -> None:
    """``whole`` holds ``size`` blocks of ``block``'s shape stacked along dim 0, in ``block``'s dtype."""
    if whole.dtype != block.dtype or whole.numel() != size * block.numel():
        raise ValueError(f"{what}: {whole_name} must hold {size} blocks of {block_name} stacked along dim 0 "
                         f"(({size}*M, N) for an (M, N) {block_name}, {block.dtype}); got {whole_name} "
                         f"{tuple(whole.shape)} {whole.dtype}, {block_name} {tuple(block.shape)} {block.dtype}")


def reduce(output, input, ctx, dst=0, op=ReduceOp.SUM, group=None, async_op=False, config=None):
    """Like ``torch.distributed.reduce``: rank ``dst``'s ``output`` (any device tensor, ``input`` itself in
    place) = ``input`` (on the heap) reduced over the members by ``op``; the others' output is left as it was.
    ``group``, ``async_op`` (barrier before changing ``input``), ``config`` as for all_gather; returns the
    launches, bound.

    Example:
        >>> ctx.ccl.reduce(x, x, dst=0)      # rank 0: the sum over members in x
    """
    op = ReduceOp(op) if not isinstance(op, ReduceOp) else op
    what = "reduce"
    config, members = _checked(ctx, what, "dst", dst, output, input, group, config, _common.REDUCE_DTYPES, True)
    if output.dtype != input.dtype or output.shape != input.shape:
        raise ValueError(f"{what}: output must have input's shape and dtype; got output {tuple(output.shape)} "
                         f"{output.dtype}, input {tuple(input.shape)} {input.dtype}")
    numel = input.numel()
    pieces = triton.cdiv(numel, config.block_size)
    # reduce_scatter's kernel with one part, the whole tensor (member place 0's part), reduced on dst alone.
    return _common.run(ctx, group, async_op, _common.fuse(config, input.nbytes), _reduce_scatter_kernel,
                       pieces if ctx.get_rank() == dst else 0, input, output, numel, numel, numel, members.tensor,
                       members.size, 0, ctx.get_rank(), ctx.get_heap_bases(), fused_programs=pieces, OP=op.value,
                       ACC=_accumulator(input.dtype), BLOCK=config.block_size)


def gather(output, input, ctx, dst=0, group=None, async_op=False, config=None):
    """Like ``torch.distributed.gather``, stacked: rank ``dst``'s ``output`` (W*M, N), on the heap on every
    member, gets member i's (M, N) ``input`` as block i. ``group``, ``async_op``, ``config`` as for all_gather;
    returns the launches, bound.

    Example:
        >>> ctx.ccl.gather(ctx.zeros(ctx.get_num_ranks() * 128, 64), ctx.ones(128, 64), dst=0)
    """
    what = "gather"
    config, members = _checked(ctx, what, "dst", dst, output, input, group, config, _common.MOVE_DTYPES, False)
    _stacked(what, output, "output", input, "input", members.size)
    numel = input.numel()
    return _common.run(ctx, group, async_op, _common.fuse(config, input.nbytes), _gather_kernel,
                       triton.cdiv(numel, config.block_size), input, output, numel, dst, members.tensor,
                       members.size, members.index, ctx.get_rank(), ctx.get_heap_bases(), BLOCK=config.block_size)


def scatter(output, input, ctx, src=0, group=None, async_op=False, config=None):
    """Like ``torch.distributed.scatter``, stacked: member i's ``output`` (M, N), on the heap, gets block i of
    rank ``src``'s (W*M, N) ``input`` (the others pass one of that shape, unread). ``group``, ``async_op``,
    ``config`` as for all_gather; returns the launches, bound.

    Example:
        >>> ctx.ccl.scatter(mine, blocks, src=0)    # member i: block i of rank 0's blocks
    """
    what = "scatter"
    config, members = _checked(ctx, what, "src", src, output, input, group, config, _common.MOVE_DTYPES, False)
    _stacked(what, input, "input", output, "output", members.size)
    numel = output.numel()
    pieces = members.size * triton.cdiv(numel, config.block_size)
    return _common.run(ctx, group, async_op, _common.fuse(config, output.nbytes), _scatter_kernel,
                       pieces if ctx.get_rank() == src else 0, input, output, numel, members.tensor, members.size,
                       ctx.get_rank(), ctx.get_heap_bases(), fused_programs=pieces, BLOCK=config.block_size)
