"""all_gather's direct variants, one kernel: each member's programs store their pieces into every member's output.

"persistent" and "partitioned" run as one launch with the barriers inside up to ``Config.fused_bytes``,
"persistent_inline" always. Members on several nodes in node blocks (or dealt to the nodes in turn) gather
hierarchically: across nodes to the members at their place, then inside each node; the network carries
(N - 1) x M per member instead of (W - G) x M. Also the device helpers other collectives share
(:func:`store_to_members`, :func:`piece_of_repeat`).

Example:
    >>> launch(ctx, out, x, members, None, False, Config(), cache="")   # what ctx.ccl.all_gather(out, x) runs
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris.ccl import _common, hierarchy
from iris.device import rma, tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes


@triton.jit
def _all_gather_piece(pid, trace, src, dst, numel, stride, src_step, dst_step, members, count, index, cur,
                      heap_bases, CACHE: tl.constexpr, BLOCK: tl.constexpr):
    repeat, offs = piece_of_repeat(pid, numel, BLOCK)
    span = trace.start(tracing.PUT, cur, -1, dst, pid, -1, elements_bytes(dst, count * BLOCK))
    mask = offs < numel
    data = tl.load(src + repeat * src_step + offs, mask=mask)
    slot = dst + repeat * dst_step + tl.cast(index, tl.int64) * stride + offs
    store_to_members(slot, data, members, count, index, cur, heap_bases, mask, 0, CACHE)  # a different peer first
    trace.end(span)


@triton.jit
def piece_of_repeat(pid, numel, BLOCK: tl.constexpr):
    """(repeat, offsets within it), both 64-bit, of program ``pid`` of a launch that does the same work
    for several repeats, cdiv(``numel``, BLOCK) programs of BLOCK elements each per repeat."""
    pieces = tl.cdiv(numel, BLOCK)
    repeat = pid // pieces
    return tl.cast(repeat, tl.int64), tl.cast(pid - repeat * pieces, tl.int64) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def store_to_members(slot, data, members, count, start, cur, heap_bases, mask, first, cache_modifier=None):
    """Store ``data`` at ``slot`` on the members at places ``start + first``, ..., ``start + count - 1`` (mod
    ``count``). On the engine path the block is stored here first and put from here: one block transfer per
    peer toward another node instead of one engine store per element."""
    if rma.ENGINE:
        tl.store(slot, data, mask=mask)
    for i in range(first, count):
        peer = tl.load(members + (start + i) % count)
        if rma.ENGINE:
            if peer != cur:
                rma.put(slot, slot, cur, peer, heap_bases, mask=mask)
        else:
            rma.store(slot, data, cur, peer, heap_bases, mask=mask, cache_modifier=cache_modifier)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_gather_kernel(src, dst, numel, stride, src_step, dst_step, members, count, index, cur, heap_bases, arrivals,
                       expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                       BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, CACHE: tl.constexpr, BLOCK: tl.constexpr):
    """Member ``index``'s ``numel`` elements of ``src`` into ``dst + index * stride`` of every member, and so
    on for each repeat r (``programs`` / cdiv(numel, BLOCK) of them): ``src + r * src_step`` into ``dst + r *
    dst_step + index * stride``."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _all_gather_piece(pid, trace, src, dst, numel, stride, src_step, dst_step, members, count, index, cur,
                          heap_bases, CACHE, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def launch(ctx, output, input, members, group, async_op: bool, config, cache: str) -> list:
    """The direct all_gather of checked tensors: one launch always for "persistent_inline", else by size, and
    hierarchically where the members' nodes allow (module doc); returns the bound launches."""
    if config.all_gather_variant == "persistent_inline":  # one launch, its barriers inside, whatever the size
        return _gather(ctx, output, input, input.numel(), group, async_op, config, cache=cache, fuse=True)
    nodes = hierarchy.nodes_of_members(ctx, config, members, "all_gather")
    arrangement = hierarchy.arrangement(nodes)
    if arrangement is not None:
        return _gather_hierarchically(ctx, output.reshape(-1), input.reshape(-1), config,
                                      *hierarchy.teams(members.ranks, nodes, ctx.get_rank(), "all_gather"), async_op,
                                      arrangement == "blocked")
    return _gather(ctx, output, input, input.numel(), group, async_op, config, cache=cache)


def _gather(ctx, dst, src, stride: int, group, async_op: bool, config, repeats: int = 1, src_step: int = 0,
            dst_step: int = 0, cache: str = "", fuse: bool | None = None) -> list:
    """Every member's ``src`` into ``dst`` (a heap tensor, or a view of one) at ``index * stride`` elements,
    ``index`` its place in ``group``; with ``repeats`` > 1, ``src`` being the first of that many blocks
    ``src_step`` elements apart, each into ``dst`` ``dst_step`` elements further on than the one before (one
    launch; ``src`` and ``dst`` views reaching that far). ``cache``: the stores' cache modifier; ``fuse``:
    one launch or three (None: by size)."""
    members = ctx.team.participants(group)
    numel = src.numel()
    fused = _common.fuse(config, repeats * src.nbytes) if fuse is None else fuse
    return _common.run(ctx, group, async_op, fused, _all_gather_kernel,
                       repeats * triton.cdiv(numel, config.block_size), src, dst, numel, stride, src_step, dst_step,
                       members.tensor, members.size, members.index, ctx.get_rank(), ctx.get_heap_bases(),
                       CACHE=cache, BLOCK=config.block_size)


def _gather_hierarchically(ctx, output, input, config, node_team, cross_team, async_op: bool, blocked: bool) -> list:
    """all_gather of members in node blocks (``blocked``: member g = n G + i) or dealt (g = i N + n), M elements
    each: place i's cross team gathers into blocks i, G + i, ... (blocked) or its run at output[i N M:] (dealt);
    then the node's members gather what each holds, in one launch. The cross step's exit barrier (every block
    arrived) begins the second."""
    numel, size, count = input.numel(), len(node_team), len(cross_team)
    place = node_team.index(ctx.get_rank())
    if blocked:  # (first block of this place, the cross members' distance, the block inside the node, repeats)
        start, across, block, repeats = place * numel, size * numel, numel, count
    else:
        start, across, block, repeats = place * count * numel, numel, count * numel, 1
    launches = _gather(ctx, output[start:], input, across, cross_team, False, config)
    return launches + _gather(ctx, output, output[start:][:block], block, node_team, async_op, config,
                              repeats=repeats, src_step=size * numel, dst_step=size * numel)
