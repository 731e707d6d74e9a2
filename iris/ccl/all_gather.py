"""all_gather: every member's (M, N) input, stacked by group index into everyone's (W*M, N) output.

Variants (``Config.all_gather_variant``): "persistent" and "partitioned" (the default kernel: each
member's programs store their pieces into every member's output), "persistent_inline" (the same kernel
always as one launch that runs the group's barriers itself), and "ring" (each member stores its block
into its right neighbour's output only; each block then travels the ring, forwarded one step at a time
after a flag on the heap says it arrived: W - 1 steps, one link each). ``Config.cache_modifier`` goes to
the stores into the members' outputs when it is a store's (".wb", ".cg", ".cs", ".wt").

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

from dataclasses import dataclass

import torch

from iris.device import rma, sync, tracing
from iris.ccl import _common, hierarchy
from iris.ccl.config import STORE_CACHE_MODIFIERS
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


@triton.jit
def _forward(slot, data, cur, peer, heap_bases, mask, FROM_MEMORY: tl.constexpr, CACHE: tl.constexpr):
    """Store ``data``, which this member holds at ``slot``, at ``slot`` on ``peer``. In a job across nodes (the
    engine path) a block put from memory (``FROM_MEMORY``: stored back as read first, so that the put's own
    reads see what a neighbour stored there), as in :func:`store_to_members`."""
    if rma.ENGINE:
        if FROM_MEMORY:
            tl.store(slot, data, mask=mask)
        rma.put(slot, slot, cur, peer, heap_bases, mask=mask)
    else:
        rma.store(slot, data, cur, peer, heap_bases, mask=mask, cache_modifier=CACHE)


@triton.jit
def _ring_piece(pid, trace, src, dst, numel, pieces, flags, members, count, index, cur, heap_bases,
                CACHE: tl.constexpr, BLOCK: tl.constexpr):
    """Piece ``pid`` of every member's block around the ring. Step 0: this member's piece into its own
    output and its right neighbour's. Step s: the piece of member index - s arrived from the left (its flag
    on this member, slot x pieces + pid, is 1); it is reset to 0 for the next call and, but at the last
    step, forwarded to the right neighbour, whose flag is then set (release)."""
    span = trace.start(tracing.PUT, cur, -1, dst, pid, -1, elements_bytes(dst, count * BLOCK))
    right = tl.load(members + (index + 1) % count)
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    data = tl.load(src + offs, mask=mask)
    mine = dst + tl.cast(index, tl.int64) * numel + offs
    tl.store(mine, data, mask=mask)
    if count > 1:
        _forward(mine, data, cur, right, heap_bases, mask, False, CACHE)
        tl.debug_barrier()  # every thread's store before the flag
        sync.signal(flags + tl.cast(index, tl.int64) * pieces + pid, 1, cur, right, heap_bases)
    for step in range(1, count):
        slot = (index + count - step) % count
        flag = flags + tl.cast(slot, tl.int64) * pieces + pid
        sync.wait_until(flag, "==", 1)
        tl.debug_barrier()  # the acquire before any thread reads what arrived
        tl.atomic_xchg(flag, 0, sem="relaxed", scope="sys")  # the next call's: its barriers order it
        if step < count - 1:
            at = dst + tl.cast(slot, tl.int64) * numel + offs
            _forward(at, tl.load(at, mask=mask, volatile=True), cur, right, heap_bases, mask, True, CACHE)
            tl.debug_barrier()  # every thread's store before the flag
            sync.signal(flag, 1, cur, right, heap_bases)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_gather_ring_kernel(src, dst, numel, pieces, flags, members, count, index, cur, heap_bases, arrivals,
                            expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr,
                            WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr,
                            CACHE: tl.constexpr, BLOCK: tl.constexpr):
    """The ring all_gather of ``numel`` elements per member (``pieces`` pieces of BLOCK), always fused: a
    program waits only on the same program of its left neighbour, and every member runs the same grid."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _ring_piece(pid, trace, src, dst, numel, pieces, flags, members, count, index, cur, heap_bases, CACHE,
                    BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


@dataclass(eq=False)  # compared (and hashed) by identity: ctx.ccl remembers calls by their workspace
class AllGatherWorkspace:
    """What the "ring" all_gather keeps between calls (the original's name and fields): ``flags``, one int32
    per piece of every member's block, on the heap, left at 0 by every call; ``variant``, ``shape``,
    ``dtype`` and ``prepared`` as the preamble set them. Other variants need nothing.

    Example:
        >>> workspace = ctx.ccl.all_gather_preamble(out, x, config=Config(all_gather_variant="ring"))
        >>> ctx.ccl.all_gather(out, x, config=Config(all_gather_variant="ring"), workspace=workspace)
    """

    variant: str = ""
    shape: tuple = ()
    dtype: torch.dtype | None = None
    flags: torch.Tensor | None = None
    prepared: bool = False


def _ring_flags(ctx, members: int, numel: int, config) -> int:
    return members * triton.cdiv(numel, config.block_size)


def all_gather_preamble(output, input, ctx, config=None, workspace=None, group=None) -> AllGatherWorkspace:
    """Make (or reuse) the workspace of repeated all_gather calls on ``output`` and ``input``: the ring's
    flags, so that no call allocates (collective: every member calls it alike).

    Args:
        output, input, config, group: as for :func:`all_gather`.
        ctx: the Iris context.
        workspace: an :class:`AllGatherWorkspace` to reuse (its flags kept where big enough), or None.

    Returns:
        The workspace, to pass to ``all_gather(..., workspace=...)``.

    Example:
        >>> config = Config(all_gather_variant="ring")
        >>> workspace = ctx.ccl.all_gather_preamble(out, x, config=config)
        >>> for _ in range(steps):
        ...     ctx.ccl.all_gather(out, x, config=config, workspace=workspace)
    """
    config = _common.config_or_default(config)
    members = _check(ctx, output, input, group)
    if workspace is None:
        workspace = AllGatherWorkspace()
    if not isinstance(workspace, AllGatherWorkspace):
        raise TypeError(f"all_gather: workspace must be an iris.ccl.all_gather.AllGatherWorkspace, got "
                        f"{type(workspace).__name__}")
    workspace.variant, workspace.shape, workspace.dtype = config.all_gather_variant, tuple(input.shape), input.dtype
    if config.all_gather_variant == "ring":
        need = _ring_flags(ctx, members.size, input.numel(), config)
        if workspace.flags is None or workspace.flags.numel() < need:
            workspace.flags = ctx.zeros(need, dtype=torch.int32)
    workspace.prepared = True
    return workspace


def _check(ctx, output, input, group):
    what = "all_gather"
    ctx.team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=False)
    ctx.team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=True)
    members = ctx.team.participants(group)
    if output.dtype != input.dtype or output.numel() != members.size * input.numel():
        raise ValueError(f"{what}: output must hold {members.size} x input ({members.size * input.numel()} "
                         f"{input.dtype} elements, shape ({members.size}*M, N)); got {tuple(output.shape)} "
                         f"{output.dtype} for input {tuple(input.shape)}")
    return members


def all_gather(output, input, ctx, group=None, async_op=False, config=None, workspace=None):
    """Like ``torch.distributed.all_gather_into_tensor``: ``output[i*M:(i+1)*M] = input`` of member i.

    Args:
        output: (W*M, N) on the symmetric heap (written by every member); W = group size.
        input: (M, N), any device tensor of this rank (read locally).
        ctx: the Iris context.
        group: a torch.distributed group of the participating ranks, or None for all.
        async_op: False: returns after a device barrier, so every member's output is complete
            in stream order; True: no barrier at the end (call ``ctx.device_barrier(group)``
            before reading ``output`` or reusing the buffers).
        config: an :class:`iris.ccl.Config` (``block_size``, ``all_gather_variant``, ``cache_modifier``).
        workspace: the "ring" variant's :class:`AllGatherWorkspace` from :func:`all_gather_preamble`; None:
            one kept by the context for this size. Other variants need none.

    Returns:
        The launches, bound (``ctx.ccl`` keeps them to replay the call).

    Example:
        >>> out = ctx.empty(ctx.get_num_ranks() * 128, 64)
        >>> ctx.ccl.all_gather(out, ctx.ones(128, 64))
        >>> ctx.ccl.all_gather(out, ctx.ones(128, 64), config=Config(all_gather_variant="ring"))
    """
    config = _common.config_or_default(config)
    what = "all_gather"
    members = _check(ctx, output, input, group)
    cache = config.cache_modifier if config.cache_modifier in STORE_CACHE_MODIFIERS else ""
    if config.all_gather_variant == "ring":
        if workspace is None:
            need = _ring_flags(ctx, members.size, input.numel(), config)
            flags = ctx.ccl.kept_workspace(("all_gather ring", need), lambda: ctx.zeros(need, dtype=torch.int32))
        else:
            flags = all_gather_preamble(output, input, ctx, config, workspace, group).flags
        pieces = triton.cdiv(input.numel(), config.block_size)
        return _common.run(ctx, group, async_op, True, _all_gather_ring_kernel, pieces, input, output, input.numel(),
                           pieces, flags, members.tensor, members.size, members.index, ctx.get_rank(),
                           ctx.get_heap_bases(), CACHE=cache, BLOCK=config.block_size)
    if config.all_gather_variant == "persistent_inline":  # one launch, its barriers inside, whatever the size
        return _gather(ctx, output, input, input.numel(), group, async_op, config, cache=cache, fuse=True)
    nodes = hierarchy.nodes_of_members(ctx, config, members, what)
    arrangement = hierarchy.arrangement(nodes)
    if arrangement is not None:
        return _gather_hierarchically(ctx, output.reshape(-1), input.reshape(-1), config,
                                      *hierarchy.teams(members.ranks, nodes, ctx.get_rank(), what), async_op,
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
