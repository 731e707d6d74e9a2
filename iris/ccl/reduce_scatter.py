"""reduce_scatter: each member gets the reduction (over all members) of its own part of the input.

Two layouts, told apart by the output's size:
- torch's (``reduce_scatter_tensor``): input (W*M, N), output (M, N); member i gets rows [i*M, (i+1)*M)
  reduced. For the whole job on several nodes in node blocks (or dealt to the nodes in turn) it reduces
  hierarchically: inside the node, member i gets its node's sum of its counterparts' parts into a kept heap
  workspace, then across nodes among the members at place i. The network carries (N - 1) parts per member
  instead of (W - G); a heap without room for the workspace reduces flat (logged).
- tiled: input and output of one shape (M, N) (1-D: one row; more dimensions: (M, the rest)), cut into
  ``Config.block_size_m`` x ``block_size_n`` tiles numbered in bands of ``Config.swizzle_size`` tile rows,
  column by column inside a band. Member i owns tiles i, i + W, ... (``Config.all_reduce_distribution`` 0)
  or the i-th run of cdiv(tiles, W) (1, the default) and gets them reduced in place of its output; the rest
  is left as it was. ``config=None``: 32 x 64 tiles (16 x 64 from 16M elements on), runs.

Example:
    >>> ctx.ccl.reduce_scatter(mine, x)                    # torch's: mine is x's (M, N) part i, reduced
    >>> ctx.ccl.reduce_scatter(tiles, ctx.ones(256, 128))  # tiled: this member's tiles of the sum
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from iris.ccl import _common, hierarchy
from iris.ccl.all_gather import piece_of_repeat
from iris.device import tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes
from iris.ccl.reduction import reduce_block
from iris.ccl.config import LOAD_CACHE_MODIFIERS, CollectiveConfig, ReduceOp
from iris.runtime.logging import WARNING, log


@triton.jit
def _reduce_scatter_piece(pid, trace, src, dst, numel, src_step, dst_step, members, count, index, cur, heap_bases,
                          OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    span = trace.start(tracing.REDUCE, cur, -1, src, pid, -1, elements_bytes(src, count * BLOCK))
    repeat, within = piece_of_repeat(pid, numel, BLOCK)  # numel: of the output, one member's share of the input
    offs = repeat * src_step + tl.cast(index, tl.int64) * numel + within
    mask = within < numel
    acc = reduce_block(src, offs, mask, members, count, index, cur, heap_bases, OP, ACC)
    tl.store(dst + repeat * dst_step + within, acc.to(dst.dtype.element_ty), mask=mask)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _reduce_scatter_kernel(src, dst, numel, src_step, dst_step, members, count, index, cur, heap_bases, arrivals,
                           expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                           BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, OP: tl.constexpr, ACC: tl.constexpr,
                           BLOCK: tl.constexpr):
    """Torch's layout: this member's part of ``src`` reduced into ``dst``, and so on for each repeat r
    (``programs`` / cdiv(numel, BLOCK) of them) from ``src + r * src_step`` into ``dst + r * dst_step``."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _reduce_scatter_piece(pid, trace, src, dst, numel, src_step, dst_step, members, count, index, cur,
                              heap_bases, OP, ACC, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


@triton.jit
def _tile_of(tile, rows, cols, GROUP: tl.constexpr):
    """(tile row, tile column) of tile number ``tile``: bands of GROUP tile rows, column by column inside."""
    band = tile // (GROUP * cols)
    inside = tile - band * (GROUP * cols)
    height = tl.minimum(rows - band * GROUP, GROUP)
    return band * GROUP + inside % height, inside // height


@triton.jit
def _reduce_scatter_tile(pid, trace, src, dst, m, n, src_m, src_n, dst_m, dst_n, members, count, index, cur,
                         heap_bases, DISTRIBUTION: tl.constexpr, GROUP: tl.constexpr, OP: tl.constexpr,
                         ACC: tl.constexpr, CACHE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.cdiv(m, BLOCK_M)
    cols = tl.cdiv(n, BLOCK_N)
    if DISTRIBUTION == 0:
        tile = index + pid * count
    else:
        tile = index * tl.cdiv(rows * cols, count) + pid
    tile_m, tile_n = _tile_of(tile, rows, cols, GROUP)
    rm = tl.cast(tile_m, tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.cast(tile_n, tl.int64) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < m) & (rn[None, :] < n)
    span = trace.start(tracing.REDUCE, cur, -1, src, pid, -1, elements_bytes(src, count * BLOCK_M * BLOCK_N))
    acc = reduce_block(src, rm[:, None] * src_m + rn[None, :] * src_n, mask, members, count, index, cur, heap_bases,
                       OP, ACC, CACHE)
    tl.store(dst + rm[:, None] * dst_m + rn[None, :] * dst_n, acc.to(dst.dtype.element_ty), mask=mask)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _reduce_scatter_tiles_kernel(src, dst, m, n, src_m, src_n, dst_m, dst_n, members, count, index, cur, heap_bases,
                                 arrivals, expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr,
                                 WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr,
                                 DISTRIBUTION: tl.constexpr, GROUP: tl.constexpr, OP: tl.constexpr,
                                 ACC: tl.constexpr, CACHE: tl.constexpr, BLOCK_M: tl.constexpr,
                                 BLOCK_N: tl.constexpr):
    """The tiled layout: the ``programs`` tiles this member owns of the (m, n) ``src`` (strides src_m, src_n),
    each reduced over the members into the same tile of ``dst`` (see the module doc)."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _reduce_scatter_tile(pid, trace, src, dst, m, n, src_m, src_n, dst_m, dst_n, members, count, index, cur,
                             heap_bases, DISTRIBUTION, GROUP, OP, ACC, CACHE, BLOCK_M, BLOCK_N)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def _overlaps(a, b) -> bool:
    return a.numel() > 0 and b.numel() > 0 and a.data_ptr() < b.data_ptr() + b.nbytes and \
        b.data_ptr() < a.data_ptr() + a.nbytes


def _part_of(input, index: int, numel: int) -> int:
    """The address of member ``index``'s part of ``input`` in torch's layout: the only place its output
    may overlap the input (that member alone reads it, and reads each block before writing it)."""
    return input.data_ptr() + index * numel * input.element_size()


class ReduceScatterWorkspace:
    """The "ring_chunked" reduce_scatter's workspace: ``flags`` (one int32 per tile, on the heap), made and
    checked, ``prepared``, ``variant``; ``ring_buffer`` stays None (ring_chunked reduces with direct reads).

    Example:
        >>> ctx.ccl.reduce_scatter(out, x, config=Config(reduce_scatter_variant="ring_chunked"),
        ...                        workspace=ReduceScatterWorkspace())
    """

    __slots__ = ("ring_buffer", "flags", "prepared", "variant")

    def __init__(self):
        self.ring_buffer = None
        self.flags = None
        self.prepared = False
        self.variant = None


def _prepare_ring_workspace(ctx, M, N, dtype, total_tiles, workspace):
    """Make (or zero) ``workspace``'s flags for ``total_tiles`` tiles (collective: every member allocates alike);
    M, N and ``dtype`` would size a ring buffer, which direct reads do not need."""
    del M, N, dtype
    if workspace.flags is None or workspace.flags.numel() != total_tiles:
        workspace.flags = ctx.zeros((total_tiles,), dtype=torch.int32)
    else:
        workspace.flags.zero_()
    workspace.prepared = True
    workspace.variant = "ring_chunked"


def _default_tiles(numel: int) -> CollectiveConfig:
    """The tiled layout's Config when none is given (module doc)."""
    return CollectiveConfig(block_size_m=16 if numel >= 16 * 1024 * 1024 else 32, block_size_n=64,
                            all_reduce_distribution=1)


def _as_matrix(tensor):
    """(M, N) view of a same-shape reduce_scatter tensor: 1-D as one row, more dimensions as (M, the rest)."""
    if tensor.dim() == 1:
        return tensor.unsqueeze(0)
    if tensor.dim() == 2:
        return tensor
    try:
        return tensor.view(tensor.shape[0], -1)
    except RuntimeError as exc:
        raise ValueError(f"reduce_scatter: a {tensor.dim()}-D tensor in the tiled layout must be viewable "
                         f"as (M, N) ({exc}); pass a contiguous one or a 2-D view") from exc


def tiles_owned(rows: int, cols: int, config: CollectiveConfig, members: int, place: int) -> int:
    """How many of ``rows`` x ``cols`` tiles the member at ``place`` of ``members`` owns (module doc)."""
    total = rows * cols
    if config.all_reduce_distribution == 0:
        return max(0, triton.cdiv(total - place, members))
    per = triton.cdiv(total, members)
    return max(0, min(per, total - place * per))


def reduce_scatter(output, input, ctx, op=ReduceOp.SUM, group=None, async_op=False, config=None, workspace=None):
    """Reduce ``input`` over the members; keep this member's part in ``output`` (layouts: see module doc).

    Args:
        output: (M, N) for input (W*M, N) (torch's layout; may be this member's own part of input), or input's
            shape (tiled: this member's tiles; may not overlap input); any device tensor of this rank.
        input: on the symmetric heap (the other members read it).
        ctx, op: the Iris context; ReduceOp.SUM (default), MAX or MIN (floats accumulate in float32).
        group, async_op: as for :func:`iris.ccl.all_gather.all_gather` (async_op: barrier before changing input).
        config: an :class:`iris.ccl.Config`: ``block_size`` (torch's layout); ``block_size_m``, ``block_size_n``,
            ``swizzle_size``, ``all_reduce_distribution``, ``cache_modifier``, ``reduce_scatter_variant`` (tiled).
        workspace: a :class:`ReduceScatterWorkspace` for "ring_chunked" (made here when None; one with fewer
            flags than the call's tiles is refused).

    Returns:
        The launches, bound (``ctx.ccl`` replays them).

    Example:
        >>> mine = torch.empty(1024, dtype=torch.bfloat16, device=ctx.get_device())
        >>> ctx.ccl.reduce_scatter(mine, ctx.ones(ctx.get_num_ranks() * 1024, dtype=torch.bfloat16))
    """
    op = ReduceOp(op) if not isinstance(op, ReduceOp) else op
    what = "reduce_scatter"
    ctx.team.check_tensor(what, "input", input, _common.REDUCE_DTYPES, symmetric=True)
    ctx.team.check_tensor(what, "output", output, _common.REDUCE_DTYPES, symmetric=False)
    members = ctx.team.participants(group)
    tiled = output.shape == input.shape and members.size > 1
    if config is None and tiled:
        config = _default_tiles(input.numel())
    config = _common.config_or_default(config)
    if output.dtype != input.dtype or not (tiled or output.numel() * members.size == input.numel()):
        raise ValueError(f"{what}: output must be 1/{members.size} of input ((W*M, N) -> (M, N)) or input's "
                         f"shape, in input's dtype; got output {tuple(output.shape)} {output.dtype}, input "
                         f"{tuple(input.shape)} {input.dtype}")
    if tiled:
        if _overlaps(output, input):
            raise ValueError(f"{what}: in the tiled layout (output of input's shape) output may not overlap "
                             "input: the other members read every tile of input")
        return _reduce_tiles(ctx, _as_matrix(output), _as_matrix(input), op, group, async_op, config, workspace)
    if _overlaps(output, input) and output.data_ptr() != _part_of(input, members.index, output.numel()):
        raise ValueError(f"{what}: in torch's layout output may overlap input only as this member's own part of it "
                         f"(elements {members.index} x M on; other members read the rest)")
    nodes = hierarchy.nodes_of_members(ctx, config, members, what)
    arrangement = hierarchy.arrangement(nodes)
    if arrangement is not None and members.size == ctx.get_num_ranks():
        node_team, cross_team = hierarchy.teams(members.ranks, nodes, ctx.get_rank(), what)
        sums = _node_sums(ctx, len(cross_team) * output.numel(), input.dtype)
        if sums is not None:
            return _reduce_hierarchically(ctx, output.reshape(-1), input.reshape(-1), op, config, node_team,
                                          cross_team, sums, arrangement == "blocked")
    return _reduce(ctx, output, input, op, group, async_op, config)


def _reduce_tiles(ctx, output, input, op, group, async_op: bool, config, workspace) -> list:
    """The tiled layout (module doc) on (M, N) views: this member's tiles, one program each."""
    members = ctx.team.participants(group)
    m, n = input.shape
    rows, cols = triton.cdiv(m, config.block_size_m), triton.cdiv(n, config.block_size_n)
    if config.reduce_scatter_variant == "ring_chunked":
        if workspace is None:
            workspace = ReduceScatterWorkspace()
        if not isinstance(workspace, ReduceScatterWorkspace):
            raise TypeError(f"reduce_scatter: workspace must be an iris.ccl.reduce_scatter.ReduceScatterWorkspace, "
                            f"got {type(workspace).__name__}")
        if not workspace.prepared or workspace.variant != "ring_chunked":
            _prepare_ring_workspace(ctx, m, n, input.dtype, rows * cols, workspace)
        if workspace.flags.numel() < rows * cols:
            raise ValueError(f"reduce_scatter: Flags array too small: the workspace has {workspace.flags.numel()} "
                             f"flags, this call needs {rows * cols} (one per tile of {config.block_size_m} x "
                             f"{config.block_size_n}); prepare the workspace with the smallest tiles you will use")
    owned = tiles_owned(rows, cols, config, members.size, members.index)
    cache = config.cache_modifier if config.cache_modifier in LOAD_CACHE_MODIFIERS else ""
    return _common.run(ctx, group, async_op, _common.fuse(config, input.nbytes), _reduce_scatter_tiles_kernel, owned,
                       input, output, m, n, input.stride(0), input.stride(1), output.stride(0), output.stride(1),
                       members.tensor, members.size, members.index, ctx.get_rank(), ctx.get_heap_bases(),
                       fused_programs=triton.cdiv(rows * cols, members.size),
                       DISTRIBUTION=config.all_reduce_distribution, GROUP=config.swizzle_size, OP=op.value,
                       ACC=_accumulator(input.dtype), CACHE=cache,
                       BLOCK_M=config.block_size_m, BLOCK_N=config.block_size_n)


def _accumulator(dtype):
    return tl.float32 if dtype.is_floating_point else tl.int32


def _reduce(ctx, output, input, op, group, async_op: bool, config, repeats: int = 1) -> list:
    """The reduce_scatter kernel's launches in torch's layout (checked arguments); with ``repeats`` > 1,
    ``input`` and ``output`` are the first of that many problems, each the last one's size further on (one
    launch; views reaching that far)."""
    members = ctx.team.participants(group)
    numel = output.numel()
    programs = repeats * triton.cdiv(numel, config.block_size)
    return _common.run(ctx, group, async_op, _common.fuse(config, repeats * input.nbytes), _reduce_scatter_kernel,
                       programs, input, output, numel, input.numel(), numel, members.tensor, members.size,
                       members.index, ctx.get_rank(), ctx.get_heap_bases(), OP=op.value,
                       ACC=_accumulator(input.dtype), BLOCK=config.block_size)


def _node_sums(ctx, numel: int, dtype):
    """The hierarchical steps' heap workspace of ``numel`` elements, kept by ``ctx.ccl``; None where the heap has
    no room (then every call of that size reduces flat, on every rank alike)."""
    def make():
        try:
            return ctx.empty(numel, dtype=dtype)
        except MemoryError as exc:
            log(WARNING, f"reduce_scatter: no room on the heap for the hierarchical workspace of {numel} {dtype} "
                         f"elements ({exc}); reducing flat across nodes at this size", ctx.get_rank(),
                ctx.get_num_ranks())
            return None

    return ctx.ccl.kept_workspace(("reduce_scatter (hierarchical)", numel, dtype), make)


def _reduce_hierarchically(ctx, output, input, op, config, node_team, cross_team, sums, blocked: bool) -> list:
    """reduce_scatter of members in node blocks (``blocked``) or dealt to the nodes in turn, M elements per
    part, G members per node, N nodes. Blocked (member g = n G + i): one launch inside the node leaves part
    m G + i's node sum at ``sums[m M:]`` for each node m; dealt (g = i N + n): place i's parts are one run,
    reduced inside the node into ``sums``. Then place i's cross team reduces ``sums``, always ending with its
    barrier (the next call rewrites the ``sums`` this one's cross members read)."""
    numel, size, count = output.numel(), len(node_team), len(cross_team)
    inside = dataclasses.replace(config, hierarchy=None)  # each step's members: one node, or one per node
    if blocked:  # node 0's node sums and the parts they sum; node m's, m M and m G M further on
        launches = _reduce(ctx, sums[:numel], input[:size * numel], op, node_team, True, inside, count)
    else:
        launches = _reduce(ctx, sums, input, op, node_team, True, inside)
    return launches + _reduce(ctx, output, sums, op, cross_team, False, inside)
