"""The collectives with a root: ``reduce`` (to ``dst``), ``gather`` (to ``dst``) and ``scatter`` (from ``src``).

Each runs inside its group's device barriers like every collective (:mod:`iris.ccl`), in the layout of
torch.distributed's ``reduce``, ``gather`` and ``scatter`` with the blocks stacked along dim 0 (the
original's layout): ``gather``'s output and ``scatter``'s input are (W*M, N), member i's block the
i-th. ``dst`` and ``src`` are global ranks, members of the group (as for :func:`iris.ccl.broadcast.broadcast`).

Where each tensor lives: the tensor another member reaches is on the symmetric heap, allocated by every
member alike (the same shape on each: ``reduce``'s input, which the root reads; ``gather``'s output, which
every member writes into the root's; ``scatter``'s output, which the root writes into every member's). The
rest may be any device tensor of the rank.

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


def _root(ctx, what: str, name: str, rank, members) -> None:
    if not isinstance(rank, int) or isinstance(rank, bool) or rank not in members.ranks:
        raise ValueError(f"{what}: {name}={rank!r} is not a member of the group {list(members.ranks)} (a global "
                         f"rank)")


def _stacked(what: str, whole, whole_name: str, block, block_name: str, size: int) -> None:
    """``whole`` holds ``size`` blocks of ``block``'s shape stacked along dim 0, in ``block``'s dtype."""
    if whole.dtype != block.dtype or whole.numel() != size * block.numel():
        raise ValueError(f"{what}: {whole_name} must hold {size} blocks of {block_name} stacked along dim 0 "
                         f"(({size}*M, N) for an (M, N) {block_name}, {block.dtype}); got {whole_name} "
                         f"{tuple(whole.shape)} {whole.dtype}, {block_name} {tuple(block.shape)} {block.dtype}")


def reduce(output, input, ctx, dst=0, op=ReduceOp.SUM, group=None, async_op=False, config=None):
    """Like ``torch.distributed.reduce``: rank ``dst``'s ``output`` = ``input`` reduced over the members.

    Args:
        output: on rank ``dst``, where the reduction lands (any device tensor; ``input`` itself for in place);
            the other members leave theirs as it was. ``input``'s shape and dtype.
        input: on the symmetric heap, the same shape on every member (rank ``dst`` reads each member's).
        ctx: the Iris context.
        dst: the global rank that receives the reduction (a member of ``group``).
        op: ReduceOp.SUM (default), MAX or MIN; floats accumulate in float32.
        group, async_op: as for :func:`iris.ccl.all_gather.all_gather` (with ``async_op`` the members may
            change ``input`` only after a ``ctx.device_barrier(group)``: rank ``dst`` may still read it).
        config: an :class:`iris.ccl.Config` (``block_size``).

    Returns:
        The launches, bound (``ctx.ccl`` keeps them to replay the call).

    Example:
        >>> x = ctx.full((1024,), float(ctx.get_rank() + 1))
        >>> ctx.ccl.reduce(x, x, dst=0)      # rank 0: 1 + 2 + ... + W everywhere in x
    """
    op = ReduceOp(op) if not isinstance(op, ReduceOp) else op
    config = _common.config_or_default(config)
    what = "reduce"
    ctx.team.check_tensor(what, "input", input, _common.REDUCE_DTYPES, symmetric=True)
    ctx.team.check_tensor(what, "output", output, _common.REDUCE_DTYPES, symmetric=False)
    members = ctx.team.participants(group)
    _root(ctx, what, "dst", dst, members)
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
    """Like ``torch.distributed.gather``, stacked: rank ``dst``'s ``output[i*M:(i+1)*M] = input`` of member i.

    Args:
        output: (W*M, N) on the symmetric heap, allocated by every member (every member writes rank
            ``dst``'s); W = group size. The others' is left as it was.
        input: (M, N), any device tensor of this rank (read locally).
        ctx: the Iris context.
        dst: the global rank that receives the blocks (a member of ``group``).
        group, async_op: as for :func:`iris.ccl.all_gather.all_gather`.
        config: an :class:`iris.ccl.Config` (``block_size``).

    Returns:
        The launches, bound (``ctx.ccl`` keeps them to replay the call).

    Example:
        >>> out = ctx.zeros(ctx.get_num_ranks() * 128, 64)
        >>> ctx.ccl.gather(out, ctx.ones(128, 64), dst=0)
    """
    config = _common.config_or_default(config)
    what = "gather"
    ctx.team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=False)
    ctx.team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=True)
    members = ctx.team.participants(group)
    _root(ctx, what, "dst", dst, members)
    _stacked(what, output, "output", input, "input", members.size)
    numel = input.numel()
    return _common.run(ctx, group, async_op, _common.fuse(config, input.nbytes), _gather_kernel,
                       triton.cdiv(numel, config.block_size), input, output, numel, dst, members.tensor,
                       members.size, members.index, ctx.get_rank(), ctx.get_heap_bases(), BLOCK=config.block_size)


def scatter(output, input, ctx, src=0, group=None, async_op=False, config=None):
    """Like ``torch.distributed.scatter``, stacked: member i's ``output`` = block i of rank ``src``'s ``input``.

    Args:
        output: (M, N) on the symmetric heap, on every member (rank ``src`` writes each member's).
        input: (W*M, N) on rank ``src``, any device tensor of it (read locally); W = group size. The other
            members pass a tensor of the same shape and dtype, which is not read.
        ctx: the Iris context.
        src: the global rank whose blocks are sent (a member of ``group``).
        group, async_op: as for :func:`iris.ccl.all_gather.all_gather`.
        config: an :class:`iris.ccl.Config` (``block_size``).

    Returns:
        The launches, bound (``ctx.ccl`` keeps them to replay the call).

    Example:
        >>> blocks = ctx.arange(ctx.get_num_ranks() * 64, dtype=torch.float32)
        >>> mine = ctx.zeros(64)
        >>> ctx.ccl.scatter(mine, blocks, src=0)    # member i: 64 * i, ..., 64 * i + 63
    """
    config = _common.config_or_default(config)
    what = "scatter"
    ctx.team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=False)
    ctx.team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=True)
    members = ctx.team.participants(group)
    _root(ctx, what, "src", src, members)
    _stacked(what, input, "input", output, "output", members.size)
    numel = output.numel()
    pieces = members.size * triton.cdiv(numel, config.block_size)
    return _common.run(ctx, group, async_op, _common.fuse(config, output.nbytes), _scatter_kernel,
                       pieces if ctx.get_rank() == src else 0, input, output, numel, members.tensor, members.size,
                       ctx.get_rank(), ctx.get_heap_bases(), fused_programs=pieces, BLOCK=config.block_size)
