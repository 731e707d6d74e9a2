"""all_gather: every member's (M, N) input, stacked by group index into everyone's (W*M, N) output.

Members on several nodes in node blocks (G members on each of N nodes, numbered node by node, as
torchrun and Slurm do; the node of each member from ``Config.hierarchy`` or the context's node map)
gather hierarchically: first across nodes, each member's block to the members at its place on the
other nodes (its cross team), then inside each node, every block a member holds to the node's other
members. The network then carries (N - 1) x M per member instead of (W - G) x M. Members dealt to the
nodes in turn (member g on the (g mod N)-th node: (0, 1, 0, 1)) gather the same way, the step inside the
node one launch (each place's blocks are one run). Other layouts, and one node, gather flat.
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris.device import rma, tracing
from iris.ccl import _common, hierarchy
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes


@triton.jit
def _all_gather_piece(pid, trace, src, dst, numel, stride, src_step, dst_step, members, count, index, cur,
                      heap_bases, BLOCK: tl.constexpr):
    repeat, offs = piece_of_repeat(pid, numel, BLOCK)
    span = trace.start(tracing.PUT, cur, -1, dst, pid, -1, elements_bytes(dst, count * BLOCK))
    mask = offs < numel
    data = tl.load(src + repeat * src_step + offs, mask=mask)
    slot = dst + repeat * dst_step + tl.cast(index, tl.int64) * stride + offs
    store_to_members(slot, data, members, count, index, cur, heap_bases, mask, 0)  # from a different peer on each
    trace.end(span)


@triton.jit
def piece_of_repeat(pid, numel, BLOCK: tl.constexpr):
    """(repeat, offsets within it), both 64-bit, of program ``pid`` of a launch that does the same work
    for several repeats, cdiv(``numel``, BLOCK) programs of BLOCK elements each per repeat."""
    pieces = tl.cdiv(numel, BLOCK)
    repeat = pid // pieces
    return tl.cast(repeat, tl.int64), tl.cast(pid - repeat * pieces, tl.int64) * BLOCK + tl.arange(0, BLOCK)


@triton.jit
def store_to_members(slot, data, members, count, start, cur, heap_bases, mask, first):
    """Store ``data`` at ``slot`` on the members at places ``start + first``, ..., ``start + count - 1`` (mod
    ``count``): every member with ``first`` 0; with ``first`` 1 and ``start`` this member's place, every other
    one. In a job across nodes (the engine path) the block is stored here first, whatever ``first``, and put
    from here: one block transfer per peer (per row of a tile) toward another node, instead of one engine
    store per element."""
    if rma.ENGINE:
        tl.store(slot, data, mask=mask)
    for i in range(first, count):
        peer = tl.load(members + (start + i) % count)
        if rma.ENGINE:
            if peer != cur:
                rma.put(slot, slot, cur, peer, heap_bases, mask=mask)
        else:
            rma.store(slot, data, cur, peer, heap_bases, mask=mask)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_gather_kernel(src, dst, numel, stride, src_step, dst_step, members, count, index, cur, heap_bases, arrivals,
                       expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                       BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, BLOCK: tl.constexpr):
    """Member ``index``'s ``numel`` elements of ``src`` into ``dst + index * stride`` of every member, and so
    on for each repeat r (``programs`` / cdiv(numel, BLOCK) of them): ``src + r * src_step`` into ``dst + r *
    dst_step + index * stride``."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _all_gather_piece(pid, trace, src, dst, numel, stride, src_step, dst_step, members, count, index, cur,
                          heap_bases, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def all_gather(output, input, ctx, group=None, async_op=False, config=None):
    """Like ``torch.distributed.all_gather_into_tensor``: ``output[i*M:(i+1)*M] = input`` of member i.

    Args:
        output: (W*M, N) on the symmetric heap (written by every member); W = group size.
        input: (M, N), any device tensor of this rank (read locally).
        ctx: the Iris context.
        group: a torch.distributed group of the participating ranks, or None for all.
        async_op: False: returns after a device barrier, so every member's output is complete
            in stream order; True: no barrier at the end (call ``ctx.device_barrier(group)``
            before reading ``output`` or reusing the buffers).
        config: an :class:`iris.ccl.Config` (``block_size``).

    Example:
        >>> out = ctx.empty(ctx.get_num_ranks() * 128, 64)
        >>> ctx.ccl.all_gather(out, ctx.ones(128, 64))
    """
    config = _common.config_or_default(config)
    what = "all_gather"
    ctx.team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=False)
    ctx.team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=True)
    members = ctx.team.participants(group)
    if output.dtype != input.dtype or output.numel() != members.size * input.numel():
        raise ValueError(f"{what}: output must hold {members.size} x input ({members.size * input.numel()} "
                         f"{input.dtype} elements, shape ({members.size}*M, N)); got {tuple(output.shape)} "
                         f"{output.dtype} for input {tuple(input.shape)}")
    nodes = hierarchy.nodes_of_members(ctx, config, members, what)
    arrangement = hierarchy.arrangement(nodes)
    if arrangement is not None:
        return _gather_hierarchically(ctx, output.reshape(-1), input.reshape(-1), config,
                                      *hierarchy.teams(members.ranks, nodes, ctx.get_rank(), what), async_op,
                                      arrangement == "blocked")
    return _gather(ctx, output, input, input.numel(), group, async_op, config)


def _gather(ctx, dst, src, stride: int, group, async_op: bool, config, repeats: int = 1, src_step: int = 0,
            dst_step: int = 0) -> list:
    """Every member's ``src`` into ``dst`` (a heap tensor, or a view of one) at ``index * stride`` elements,
    ``index`` its place in ``group``; with ``repeats`` > 1, ``src`` being the first of that many blocks
    ``src_step`` elements apart, each into ``dst`` ``dst_step`` elements further on than the one before (one
    launch; ``src`` and ``dst`` views reaching that far)."""
    members = ctx.team.participants(group)
    numel = src.numel()
    return _common.run(ctx, group, async_op, _common.fuse(config, repeats * src.nbytes), _all_gather_kernel,
                       repeats * triton.cdiv(numel, config.block_size), src, dst, numel, stride, src_step, dst_step,
                       members.tensor, members.size, members.index, ctx.get_rank(), ctx.get_heap_bases(),
                       BLOCK=config.block_size)


def _gather_hierarchically(ctx, output, input, config, node_team, cross_team, async_op: bool, blocked: bool) -> list:
    """all_gather of members in node blocks (``blocked``) or dealt to the nodes in turn (module doc), with M
    elements per member, G members per node and N nodes: member g gets its block at output[g M:]. In node
    blocks member g = n G + i (node n, place i): across nodes, the cross team of place i gathers into blocks
    i, G + i, 2 G + i, ... (G M apart); then inside the node, in one launch repeated for each node m, the
    node's members gather block m G + i of each into output[m G M:]. Dealt, member g = i N + n: the cross
    team of place i is members i N, ..., i N + N - 1, which gather into their run of blocks at
    output[i N M:]; then inside the node each member's run is its one block. The group's barriers begin the
    first step; the cross step's exit barrier (every block arrived) begins the second."""
    numel, size, count = input.numel(), len(node_team), len(cross_team)
    place = node_team.index(ctx.get_rank())
    if blocked:  # (first block of this place, the cross members' distance, the block inside the node, repeats)
        start, across, block, repeats = place * numel, size * numel, numel, count
    else:
        start, across, block, repeats = place * count * numel, numel, count * numel, 1
    launches = _gather(ctx, output[start:], input, across, cross_team, False, config)
    return launches + _gather(ctx, output, output[start:][:block], block, node_team, async_op, config,
                              repeats=repeats, src_step=size * numel, dst_step=size * numel)
