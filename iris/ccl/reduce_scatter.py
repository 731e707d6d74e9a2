"""reduce_scatter: each member gets the reduction (over all members) of its own part of the input.

Two layouts, told apart by the output's size:
- torch's (``reduce_scatter_tensor``): input (W*M, N), output (M, N); member i gets rows
  ``[i*M, (i+1)*M)`` reduced;
- the original Iris's: input and output both (M, N); member i gets its two_shot slice (blocks
  i, i + W, ... of ``Config.block_size`` elements of the flat tensor) reduced, at the same positions,
  and the rest of its output is left as it was.

In torch's layout, members on several nodes in node blocks (G members on each of N nodes, numbered node
by node; the nodes from ``Config.hierarchy`` or the context's node map) reduce hierarchically when the
group is the whole job: first inside the node, where the member at place i gets its node's sum of parts
i, G + i, 2G + i, ... (one per node: its counterparts' parts) into a kept heap workspace of N parts (one
launch for all N), then across nodes among the members at place i, each getting its own part summed over
the nodes. The network then carries (N - 1) parts per member instead of (W - G); floats are rounded to the
data's dtype between the steps. Members dealt to the nodes in turn (member g on the (g mod N)-th node)
reduce the same way. A group that is not the whole job reduces flat (the workspace is a heap allocation
that every rank makes), and so do other layouts, one node, and a heap with no room for the workspace
(logged).
"""

from __future__ import annotations

import dataclasses

import triton
import triton.language as tl

from iris.ccl import _common, hierarchy
from iris.ccl.all_gather import piece_of_repeat
from iris.device import tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes
from iris.ccl.reduction import reduce_block
from iris.ccl.config import ReduceOp
from iris.logging import WARNING, log


@triton.jit
def _reduce_scatter_piece(pid, trace, src, dst, numel, src_step, dst_step, members, count, index, cur, heap_bases,
                          INTERLEAVED: tl.constexpr, OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    span = trace.start(tracing.REDUCE, cur, -1, src, pid, -1, elements_bytes(src, count * BLOCK))
    if INTERLEAVED:  # numel: of input and output alike
        offs = (tl.cast(pid, tl.int64) * count + index) * BLOCK + tl.arange(0, BLOCK)
        out = offs
        mask = offs < numel
    else:  # numel: of the output, one member's share of the input (of each repeat's)
        repeat, within = piece_of_repeat(pid, numel, BLOCK)
        offs = repeat * src_step + tl.cast(index, tl.int64) * numel + within
        out = repeat * dst_step + within
        mask = within < numel
    acc = reduce_block(src, offs, mask, members, count, index, cur, heap_bases, OP, ACC)
    tl.store(dst + out, acc.to(dst.dtype.element_ty), mask=mask)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _reduce_scatter_kernel(src, dst, numel, src_step, dst_step, members, count, index, cur, heap_bases, arrivals,
                           expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                           BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, INTERLEAVED: tl.constexpr,
                           OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """Torch's layout: this member's part of ``src`` reduced into ``dst``, and so on for each repeat r
    (``programs`` / cdiv(numel, BLOCK) of them) from ``src + r * src_step`` into ``dst + r * dst_step``; the
    original's: its two_shot slice of ``src`` into the same positions of ``dst`` (see the module doc)."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _reduce_scatter_piece(pid, trace, src, dst, numel, src_step, dst_step, members, count, index, cur,
                              heap_bases, INTERLEAVED, OP, ACC, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def _overlaps(a, b) -> bool:
    return a.numel() > 0 and b.numel() > 0 and a.data_ptr() < b.data_ptr() + b.nbytes and \
        b.data_ptr() < a.data_ptr() + a.nbytes


def _part_of(input, index: int, numel: int) -> int:
    """The address of member ``index``'s part of ``input`` in torch's layout: the only place its output
    may overlap the input (that member alone reads it, and reads each block before writing it)."""
    return input.data_ptr() + index * numel * input.element_size()


def reduce_scatter(output, input, ctx, op=ReduceOp.SUM, group=None, async_op=False, config=None):
    """Reduce ``input`` over the members; keep this member's part in ``output`` (layouts: see module doc).

    Args:
        output: (M, N) for input (W*M, N), or input's shape for the original layout; any device
            tensor of this rank (in torch's layout it may be this member's own part of input).
        input: on the symmetric heap (the other members read it).
        ctx: the Iris context.
        op: ReduceOp.SUM (default), MAX or MIN; floats accumulate in float32.
        group, async_op: as for :func:`iris.ccl.all_gather.all_gather`. With async_op=True,
            barrier before changing ``input`` again.
        config: an :class:`iris.ccl.Config` (``block_size``; ``reduce_scatter_variant`` "two_shot").

    Example:
        >>> world = ctx.get_num_ranks()
        >>> x = ctx.ones(world * 1024, dtype=torch.bfloat16)
        >>> mine = torch.empty(1024, dtype=torch.bfloat16, device=ctx.get_device())
        >>> ctx.ccl.reduce_scatter(mine, x)   # mine == world everywhere
    """
    op = ReduceOp(op) if not isinstance(op, ReduceOp) else op
    config = _common.config_or_default(config)
    what = "reduce_scatter"
    ctx.team.check_tensor(what, "input", input, _common.REDUCE_DTYPES, symmetric=True)
    ctx.team.check_tensor(what, "output", output, _common.REDUCE_DTYPES, symmetric=False)
    members = ctx.team.participants(group)
    interleaved = output.shape == input.shape and members.size > 1
    if output.dtype != input.dtype or not (interleaved or output.numel() * members.size == input.numel()):
        raise ValueError(f"{what}: output must be 1/{members.size} of input ((W*M, N) -> (M, N)) or input's "
                         f"shape, in input's dtype; got output {tuple(output.shape)} {output.dtype}, input "
                         f"{tuple(input.shape)} {input.dtype}")
    if not interleaved and _overlaps(output, input) and output.data_ptr() != _part_of(input, members.index,
                                                                                     output.numel()):
        raise ValueError(f"{what}: in torch's layout output may overlap input only as this member's own part of it "
                         f"(elements {members.index} x M on; other members read the rest)")
    if not interleaved:
        nodes = hierarchy.nodes_of_members(ctx, config, members, what)
        arrangement = hierarchy.arrangement(nodes)
        if arrangement is not None and members.size == ctx.get_num_ranks():
            node_team, cross_team = hierarchy.teams(members.ranks, nodes, ctx.get_rank(), what)
            sums = _node_sums(ctx, len(cross_team) * output.numel(), input.dtype)
            if sums is not None:
                return _reduce_hierarchically(ctx, output.reshape(-1), input.reshape(-1), op, config, node_team,
                                              cross_team, sums, arrangement == "blocked")
    return _reduce(ctx, output, input, op, group, async_op, config, interleaved)


def _reduce(ctx, output, input, op, group, async_op: bool, config, interleaved: bool, repeats: int = 1) -> list:
    """The reduce_scatter kernel's launches (checked arguments); with ``repeats`` > 1 (torch's layout),
    ``input`` and ``output`` are the first of that many problems, each the last one's size further on (one
    launch; views reaching that far)."""
    members = ctx.team.participants(group)
    numel = input.numel() if interleaved else output.numel()
    blocks = triton.cdiv(numel, config.block_size)
    programs = triton.cdiv(blocks, members.size) if interleaved else repeats * blocks
    return _common.run(ctx, group, async_op, _common.fuse(config, repeats * input.nbytes), _reduce_scatter_kernel,
                       programs, input, output, numel, input.numel(), numel, members.tensor, members.size,
                       members.index, ctx.get_rank(), ctx.get_heap_bases(), INTERLEAVED=interleaved, OP=op.value,
                       ACC=tl.float32 if input.dtype.is_floating_point else tl.int32, BLOCK=config.block_size)


def _node_sums(ctx, numel: int, dtype):
    """The hierarchical steps' heap workspace of ``numel`` elements, kept by ``ctx.ccl``; None where the heap
    has no room for it: that call, and every later one of that size and dtype, reduces flat (every rank
    alike: the heaps of a job hold the same allocations)."""
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
    """reduce_scatter of members in node blocks (``blocked``) or dealt to the nodes in turn (module doc), with
    M elements per part, G members per node and N nodes. In node blocks member g = n G + i (node n, place
    i): inside the node, in one launch, for each node m the node's members reduce parts m G, ..., m G + G - 1
    and the member at place i keeps part m G + i's node sum at ``sums[m M:]``. Dealt, member g = i N + n:
    the parts of place i's cross team are one run, i N, ..., i N + N - 1, which one reduce inside the node
    leaves in ``sums``. Then the cross team of place i reduces ``sums``, member n getting part n (its own).
    The last step always ends with its barrier: the next call rewrites the ``sums`` that this one's cross
    members read."""
    numel, size, count = output.numel(), len(node_team), len(cross_team)
    inside = dataclasses.replace(config, hierarchy=None)  # each step's members: one node, or one per node
    if blocked:  # node 0's node sums and the parts they sum; node m's, m M and m G M further on
        launches = _reduce(ctx, sums[:numel], input[:size * numel], op, node_team, True, inside, False, count)
    else:
        launches = _reduce(ctx, sums, input, op, node_team, True, inside, False)
    return launches + _reduce(ctx, output, sums, op, cross_team, False, inside, False)
