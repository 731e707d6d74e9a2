"""all_to_all_v: all_to_all with per-member row counts held on the device (no host synchronisation).

Like ``torch.distributed.all_to_all_single`` with ``input_split_sizes``, except that the counts are a
device tensor, so a kernel (a router) can decide them and nothing waits on the host: each member sends
``input_splits[j]`` rows of its input to member j, the rows for member 0 first, then member 1's, and so on;
member j's output holds the rows from member 0, then member 1's, and so on, packed; ``output_splits[i]``
receives how many came from member i. torch symmetric memory's ``all_to_all_vdev`` does the same.

How: a first launch publishes this member's counts and where each member's rows start into a small table on
every member's heap; after the group's barrier each member reads its table and pulls its rows from every
member's input. So ``input`` is on the symmetric heap; ``output`` may be any device tensor of the rank. The
members' sizes differ, so the launch's shape follows the config alone: one launch of PROGRAMS programs that
runs the group's barriers itself, or (``Config.fused_bytes`` 0) three launches.

Rows that would land past the end of ``output`` are not written (``output_splits`` still says what was
sent, so a caller can check that their sum fits); counts past the end of ``input`` are cut to what it holds.

Example:
    >>> world, rank = ctx.get_num_ranks(), ctx.get_rank()
    >>> splits = torch.full((world,), 2, dtype=torch.int64, device=ctx.get_device())  # 2 rows to each member
    >>> x = ctx.full((2 * world, 8), float(rank))
    >>> out = torch.empty(2 * world, 8, device=ctx.get_device())
    >>> received = torch.empty(world, dtype=torch.int64, device=ctx.get_device())
    >>> ctx.ccl.all_to_all_v(out, x, splits, received)   # out rows 2i, 2i+1 hold i; received == 2 everywhere
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.ccl import _common
from iris.device import rma, tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes
from iris.replay import bind

SPLIT_DTYPES = (torch.int64, torch.int32)
# The programs of the pulling launch. Every member must launch the same grid and make the same choice of one
# fused launch or three (iris.device.barrier), and here the sizes differ between members: both follow the
# config alone (one launch unless Config.fused_bytes is 0).
PROGRAMS = 16


@triton.jit(do_not_specialize=GROUP_ARGS)
def _publish_kernel(splits, rows, table, members, count, index, cur, heap_bases, WORLD: tl.constexpr):
    """One program: (rows for member j, where they start in this member's input) into slot ``index`` of member
    j's table, for every member j; counts cut to the ``rows`` the input holds."""
    j = tl.arange(0, WORLD)
    inside = j < count
    wanted = tl.maximum(tl.load(splits + j, mask=inside, other=0).to(tl.int64), 0)
    start = tl.cumsum(wanted, 0) - wanted
    sent = tl.minimum(wanted, tl.maximum(rows - start, 0))
    for i in range(0, count):
        peer = tl.load(members + i)
        mine = tl.sum(tl.where(j == i, sent, 0), 0)
        begin = tl.sum(tl.where(j == i, start, 0), 0)
        slot = table + 2 * tl.cast(index, tl.int64)
        rma.store(slot, mine, cur, peer, heap_bases)
        rma.store(slot + 1, begin, cur, peer, heap_bases)


@triton.jit
def _pull(v, programs, trace, src, dst, width, capacity, table, received, members, count, cur, heap_bases,
          BLOCK: tl.constexpr):
    """Virtual program ``v`` of ``programs``: its share of every member's rows for this member, pulled from
    that member's ``src`` into their place in ``dst`` (``width`` elements a row, ``capacity`` rows)."""
    landed = tl.cast(0, tl.int64)
    for i in range(0, count):
        peer = tl.load(members + i)
        rows = tl.load(table + 2 * i)
        first = tl.load(table + 2 * i + 1)
        if v == 0:
            tl.store(received + i, rows.to(received.dtype.element_ty))
        n = tl.minimum(rows, tl.maximum(capacity - landed, 0)) * width
        span = trace.start(tracing.GET, cur, peer, src, v, i, elements_bytes(src, n))
        for b in range(v, tl.cdiv(n, BLOCK), programs):
            offs = tl.cast(b, tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            data = rma.load(src + first * width + offs, cur, peer, heap_bases, mask=mask)
            tl.store(dst + landed * width + offs, data, mask=mask)
        trace.end(span)
        landed += rows


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_to_all_v_kernel(src, dst, width, capacity, table, received, members, count, index, cur, heap_bases,
                         arrivals, expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr,
                         WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, BLOCK: tl.constexpr):
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for v in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _pull(v, programs, trace, src, dst, width, capacity, table, received, members, count, cur, heap_bases,
              BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def _splits(what: str, name: str, splits, size: int, device) -> torch.Tensor:
    if not isinstance(splits, torch.Tensor):
        try:
            splits = torch.tensor(list(splits), dtype=torch.int64, device=device)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{what}: {name} must be a device tensor of {size} counts (int64 or int32) or a list of "
                            f"ints; got {type(splits).__name__}") from exc
    if splits.dtype not in SPLIT_DTYPES or splits.shape != (size,) or splits.device != device \
            or not splits.is_contiguous():
        raise ValueError(f"{what}: {name} must be a contiguous ({size},) int64 or int32 tensor on {device}, one count "
                         f"per member; got {tuple(splits.shape)} {splits.dtype} on {splits.device}")
    return splits


def all_to_all_v(output, input, ctx, input_splits, output_splits=None, group=None, async_op=False, config=None):
    """Rows of ``input`` to each member by ``input_splits`` (device counts); see :mod:`iris.ccl.all_to_all_v`.

    Args:
        output: (R_out, ...) any device tensor of this rank, rows of ``input``'s shape and dtype.
        input: (R_in, ...) on the symmetric heap, allocated alike on every member (the same shape: a capacity of
            rows, of which ``input_splits`` says how many go where); the members read their rows from it.
        ctx: the Iris context.
        input_splits: (W,) int64 or int32 device tensor: rows for each member, in member order (a list of ints
            is copied to the device first, on every call).
        output_splits: None, or a (W,) int64/int32 device tensor that receives the rows from each member.
        group: a torch.distributed group of the participating ranks, or None for all.
        async_op: False: ends with the group's device barrier; True: none (call ``ctx.device_barrier(group)``
            before the next all_to_all_v, or before changing ``input``).
        config: an :class:`iris.ccl.Config` (``block_size``).

    Returns:
        The launches, bound (``ctx.ccl`` keeps them to replay the call).

    Example:
        >>> splits = torch.tensor([1, 3], device=ctx.get_device())          # at 2 ranks
        >>> ctx.ccl.all_to_all_v(out, x, splits, received)
    """
    config = _common.config_or_default(config)
    what = "all_to_all_v"
    team = ctx.team
    team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=True)
    team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=False)
    members = team.participants(group)
    if input.dim() < 1 or output.dim() != input.dim() or output.shape[1:] != input.shape[1:] \
            or output.dtype != input.dtype:
        raise ValueError(f"{what}: output and input must be (R, ...) rows of one shape and dtype; got output "
                         f"{tuple(output.shape)} {output.dtype}, input {tuple(input.shape)} {input.dtype}")
    input_splits = _splits(what, "input_splits", input_splits, members.size, team.device)
    if output_splits is None:
        output_splits = ctx.ccl.kept_workspace((what, "counts", members.size, str(team.device)),
                                               lambda: torch.empty(members.size, dtype=torch.int64,
                                                                   device=team.device))
    output_splits = _splits(what, "output_splits", output_splits, members.size, team.device)
    # the table: (rows, first row) from each member; allocated alike on every member (collective calls)
    table = ctx.ccl.kept_workspace((what, "table", members.size), lambda: ctx.zeros(2 * members.size,
                                                                                   dtype=torch.int64))
    width = input[0].numel() if input.shape[0] else max(1, output[0].numel() if output.shape[0] else 1)
    publish = bind(_publish_kernel, (1,), input_splits, input.shape[0], table, members.tensor, members.size,
                   members.index, ctx.get_rank(), ctx.get_heap_bases(), WORLD=triton.next_power_of_2(members.size))
    publish()
    return [publish] + _common.run(ctx, group, async_op, config.fused_bytes > 0, _all_to_all_v_kernel,
                                   PROGRAMS, input, output, width, output.shape[0], table, output_splits,
                                   members.tensor, members.size, members.index, ctx.get_rank(), ctx.get_heap_bases(),
                                   BLOCK=config.block_size)
