"""all_to_all_v: all_to_all with per-member row counts, which may be held on the device (no host synchronisation).

MPI's Alltoallv: ``all_to_all_v(output, input, send_counts, send_displs, recv_counts, recv_displs)``; each
member sends ``send_counts[j]`` rows of its input (from row ``send_displs[j]``, or packed in member order) to
member j, which places them at its ``recv_displs[i]`` (or packed in member order). The counts may be a device
tensor, so a kernel (a router) can decide them and nothing waits on the host: the receivers learn them on the
device, and ``recv_counts`` given as a device tensor receives them (as torch symmetric memory's
``all_to_all_vdev`` returns its output splits). :func:`all_to_all_v_columns` moves blocks of columns instead.

How: a first launch publishes this member's counts and where each member's rows start into a small table in
every member's heap (its reserved tail); after the group's barrier each member reads its table and pulls its
rows from every member's input. So ``input`` is on the symmetric heap, allocated alike on every member;
``output`` may be any device tensor of the rank. The launch's shape follows ``input``, the same on every
member: one launch that runs the group's barriers itself up to ``Config.fused_bytes``, three above.

Counts given as lists are checked against the tensors before any launch. Counts on the device cannot be:
rows that would land past the end of ``output`` are not written (the received counts still say what was
sent, so a caller can check), and counts past the end of ``input`` are cut to what it holds.

Example:
    >>> world, rank = ctx.get_num_ranks(), ctx.get_rank()
    >>> counts = torch.full((world,), 2, dtype=torch.int64, device=ctx.get_device())  # 2 rows to each member
    >>> x = ctx.full((2 * world, 8), float(rank))
    >>> out = torch.empty(2 * world, 8, device=ctx.get_device())
    >>> received = torch.empty(world, dtype=torch.int64, device=ctx.get_device())
    >>> ctx.ccl.all_to_all_v(out, x, counts, recv_counts=received)   # rows 2i, 2i+1 of out hold i; received: 2s
"""

from __future__ import annotations

import numbers

import torch
import triton
import triton.language as tl

from iris.ccl import _common
from iris.device import rma, tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes
from iris.host.replay import bind

SPLIT_DTYPES = (torch.int64, torch.int32)
# The most programs of the pulling launch. Every member must launch the same grid and make the same choice of
# one fused launch or three (iris.device.barrier): both follow input, the one tensor of the same shape on every
# member (counts and outputs differ).
PROGRAMS = 1024


@triton.jit(do_not_specialize=GROUP_ARGS)
def _publish_kernel(counts, displs, rows, table, members, count, cur, heap_bases, WORLD: tl.constexpr,
                    DISPLS: tl.constexpr):
    """One program: (rows for member j, where they start in this member's input: ``displs[j]`` with DISPLS, else
    packed in member order) into slot ``cur`` (this rank's, not its index in the group) of member j's table, for
    every member j; counts cut to the ``rows`` the input holds. A slot per rank keeps calls of groups that overlap
    apart: a rank that skipped a call may publish for the next while a peer still reads the call it skipped, from
    the other members' slots."""
    j = tl.arange(0, WORLD)
    inside = j < count
    wanted = tl.maximum(tl.load(counts + j, mask=inside, other=0).to(tl.int64), 0)
    if DISPLS:
        start = tl.maximum(tl.load(displs + j, mask=inside, other=0).to(tl.int64), 0)
    else:
        start = tl.cumsum(wanted, 0) - wanted
    sent = tl.minimum(wanted, tl.maximum(rows - start, 0))
    for i in range(0, count):
        peer = tl.load(members + i)
        mine = tl.sum(tl.where(j == i, sent, 0), 0)
        begin = tl.sum(tl.where(j == i, start, 0), 0)
        slot = table + 2 * tl.cast(cur, tl.int64)
        rma.store(slot, mine, cur, peer, heap_bases)
        rma.store(slot + 1, begin, cur, peer, heap_bases)


@triton.jit
def _pull(v, programs, trace, src, dst, width, capacity, src_stride, dst_stride, table, received, caps, displs,
          members, count, cur, heap_bases, RECEIVED: tl.constexpr, CAPS: tl.constexpr, DISPLS: tl.constexpr,
          COLUMNS: tl.constexpr, MEMBERS: tl.constexpr, BLOCK: tl.constexpr):
    """Virtual program ``v`` of ``programs``: its share of every member's rows for this member, pulled from
    that member's ``src`` into their place in ``dst`` (``width`` elements a row, ``capacity`` rows): at
    ``displs[i]`` with DISPLS, else packed in member order; at most ``caps[i]`` rows with CAPS. With RECEIVED,
    ``received[i]`` = the rows member i sent. ``MEMBERS``: the group's size rounded up to a power of two.
    With COLUMNS the counts are of columns of (``width``, columns) matrices whose rows lie ``src_stride`` and
    ``dst_stride`` elements apart (``capacity``: the columns of ``dst``): a member's block of c columns is
    ``width`` pieces of c elements.

    Program v starts at member v mod count and goes round: at any moment the programs pull from every member at
    once (this member's own rows, a local copy, run beside the peers' instead of after them)."""
    j = tl.arange(0, MEMBERS)
    inside = j < count
    sent = tl.load(table + 2 * tl.load(members + j, mask=inside, other=0), mask=inside, other=0)  # slots by rank
    if RECEIVED:
        if v == 0:
            tl.store(received + j, sent.to(received.dtype.element_ty), mask=inside)
    taken = sent
    if CAPS:
        taken = tl.minimum(taken, tl.maximum(tl.load(caps + j, mask=inside, other=0).to(tl.int64), 0))
    if DISPLS:
        starts = tl.maximum(tl.load(displs + j, mask=inside, other=0).to(tl.int64), 0)
    else:
        starts = tl.cumsum(taken, 0) - taken  # packed in member order
    for k in range(0, count):
        i = (v + k) % count
        peer = tl.load(members + i)
        rows = tl.sum(tl.where(j == i, taken, 0), 0)
        at = tl.sum(tl.where(j == i, starts, 0), 0)
        first = tl.load(table + 2 * peer + 1)
        kept = tl.minimum(rows, tl.maximum(capacity - at, 0))
        n = kept * width
        span = trace.start(tracing.GET, cur, peer, src, v, i, elements_bytes(src, n))
        for b in range(v, tl.cdiv(n, BLOCK), programs):
            offs = tl.cast(b, tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            if COLUMNS:  # element offs is row offs // kept, column offs % kept of the block
                row = offs // kept
                column = offs - row * kept
                data = rma.load(src + row * src_stride + first + column, cur, peer, heap_bases, mask=mask)
                tl.store(dst + row * dst_stride + at + column, data, mask=mask)
            else:
                data = rma.load(src + first * width + offs, cur, peer, heap_bases, mask=mask)
                tl.store(dst + at * width + offs, data, mask=mask)
        trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_to_all_v_kernel(src, dst, width, capacity, src_stride, dst_stride, table, received, caps, displs, members,
                         count, index, cur, heap_bases, arrivals, expected, programs, FUSED: tl.constexpr,
                         EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr,
                         TRACE: tl.constexpr, RECEIVED: tl.constexpr, CAPS: tl.constexpr, DISPLS: tl.constexpr,
                         COLUMNS: tl.constexpr, MEMBERS: tl.constexpr, BLOCK: tl.constexpr):
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for v in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _pull(v, programs, trace, src, dst, width, capacity, src_stride, dst_stride, table, received, caps, displs,
              members, count, cur, heap_bases, RECEIVED, CAPS, DISPLS, COLUMNS, MEMBERS, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def _counts(what: str, name: str, values, size: int, device) -> torch.Tensor:
    """``values`` as a (size,) int64/int32 device tensor (a list or tuple of ints is copied there)."""
    if not isinstance(values, torch.Tensor):
        try:
            values = list(values)
        except TypeError as exc:
            raise TypeError(f"{what}: {name} must be a device tensor of {size} counts (int64 or int32) or a list of "
                            f"ints; got {type(values).__name__}") from exc
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 0 for v in values):
            raise ValueError(f"{what}: {name} must be whole numbers >= 0; got {values}")
        values = torch.tensor(values, dtype=torch.int64, device=device)
    if values.dtype not in SPLIT_DTYPES or values.shape != (size,) or values.device != device \
            or not values.is_contiguous():
        raise ValueError(f"{what}: {name} must be a contiguous ({size},) int64 or int32 tensor on {device}, one count "
                         f"per member; got {tuple(values.shape)} {values.dtype} on {values.device}")
    return values


def _host_extent(what: str, counts, displs, rows: int, tensor: str) -> None:
    """Counts (and displacements) given as host lists: checked against the rows ``tensor`` holds."""
    if not all(isinstance(v, (list, tuple)) for v in (counts, displs if displs is not None else counts)):
        return
    if not all(isinstance(c, int) for c in counts):
        return
    starts = list(displs) if displs is not None else [sum(counts[:i]) for i in range(len(counts))]
    if len(starts) == len(counts) and all(isinstance(d, int) for d in starts):
        end = max((d + c for d, c in zip(starts, counts) if c > 0), default=0)
        if end > rows:
            raise ValueError(f"{what}: the counts {list(counts)} at {starts} reach row {end}; {tensor} holds {rows}")


def all_to_all_v(output, input, ctx, send_counts, send_displs=None, recv_counts=None, recv_displs=None, group=None,
                 async_op=False, config=None):
    """Rows of ``input`` to each member by ``send_counts`` (MPI's Alltoallv); see :mod:`iris.ccl.all_to_all_v`.

    Counts and displacements count rows of dim 0 (elements of a 1-D tensor). Each may be a device tensor of W
    int64/int32 values, read on the device (nothing waits on the host, and a graph replays the values current
    at the replay), or a list of ints (copied to the device on every call, and checked against the tensors
    first).

    Args:
        output: (R_out, ...) any device tensor of this rank, rows of ``input``'s shape and dtype.
        input: (R_in, ...) on the symmetric heap, allocated alike on every member (the same shape: a capacity of
            rows, of which the counts say how many go where); the members read their rows from it.
        ctx: the Iris context.
        send_counts: rows for each member, in member order.
        send_displs: where each member's rows start in ``input``; None: packed in member order.
        recv_counts: a device tensor: receives the rows each member sent (written); a list: the most rows to
            take from each member (expected counts); None: neither.
        recv_displs: where each member's rows land in ``output``; None: packed in member order.
        group: a torch.distributed group of the participating ranks, or None for all.
        async_op: False: ends with the group's device barrier; True: none (call ``ctx.device_barrier(group)``
            before the next all_to_all_v, or before changing ``input``).
        config: an :class:`iris.ccl.Config` (``block_size``, ``fused_bytes``).

    Returns:
        The launches, bound (``ctx.ccl`` keeps them to replay the call).

    Example:
        >>> counts = torch.tensor([1, 3], device=ctx.get_device())          # at 2 ranks
        >>> received = torch.empty(2, dtype=torch.int64, device=ctx.get_device())
        >>> ctx.ccl.all_to_all_v(out, x, counts, recv_counts=received)
        >>> ctx.ccl.all_to_all_v(out, x, [4, 4], [0, 4], [4, 4], [0, 4])     # MPI's four lists
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
    _host_extent(what, send_counts, send_displs, input.shape[0], "input")
    if recv_counts is not None and not isinstance(recv_counts, torch.Tensor):
        _host_extent(what, recv_counts, recv_displs, output.shape[0], "output")
    device, size = team.device, members.size
    counts = _counts(what, "send_counts", send_counts, size, device)
    send_at = None if send_displs is None else _counts(what, "send_displs", send_displs, size, device)
    received = recv_counts if isinstance(recv_counts, torch.Tensor) else None
    caps = None if recv_counts is None or received is not None else _counts(what, "recv_counts", recv_counts, size,
                                                                            device)
    if received is not None:
        received = _counts(what, "recv_counts", received, size, device)
    land_at = None if recv_displs is None else _counts(what, "recv_displs", recv_displs, size, device)
    width = input[0].numel() if input.shape[0] else (output[0].numel() if output.shape[0] else 1)
    return _exchange(ctx, group, async_op, config, members, output, input, counts, send_at, received, caps, land_at,
                     width=width, available=input.shape[0], capacity=output.shape[0], span=input.numel())


def all_to_all_v_columns(output, input, ctx, output_split_sizes, input_split_sizes, group=None, async_op=False,
                         config=None):
    """Blocks of columns of ``input`` to each member (torch's ``all_to_all_single`` with split sizes, along
    dim 1): member i's ``input_split_sizes[j]`` columns for member j, taken in member order from column 0, land in
    member j's ``output`` at column ``sum(output_split_sizes[:i])`` (``output_split_sizes[i]`` of them at most).

    Args:
        output: (M, sum(output_split_sizes)) or wider, any contiguous device tensor of this rank.
        input: (M, sum(input_split_sizes)) or wider, on the symmetric heap: a buffer allocated alike on every
            member, or the same leading columns of one (``buffer[:, :n]``, rows ``buffer.stride(0)`` apart).
        ctx: the Iris context.
        output_split_sizes: columns to receive from each member (W ints, or a device tensor).
        input_split_sizes: columns to send to each member (W ints, or a device tensor).
        group, async_op, config: as :func:`all_to_all_v`.

    Example:
        >>> buffer = ctx.zeros(64, 4 * 16, dtype=torch.float16)           # alike on every rank, at 2 ranks
        >>> x = buffer[:, :2 * (rank + 1) * 8]                              # (rank + 1) * 8 columns to each
        >>> out = torch.empty(64, 8 + 16, dtype=torch.float16, device=ctx.get_device())
        >>> all_to_all_v_columns(out, x, ctx, [8, 16], [(rank + 1) * 8] * 2)
    """
    config = _common.config_or_default(config)
    what = "all_to_all_v"
    team = ctx.team
    team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=False)
    team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=True, rows=True)
    if input.dim() != 2 or output.dim() != 2 or input.shape[0] != output.shape[0] or input.dtype != output.dtype:
        raise ValueError(f"{what}: output and input must be (M, columns) of one M and dtype; got output "
                         f"{tuple(output.shape)} {output.dtype}, input {tuple(input.shape)} {input.dtype}")
    members = team.participants(group)
    _host_extent(what, input_split_sizes, None, input.shape[1], "input (columns)")
    _host_extent(what, output_split_sizes, None, output.shape[1], "output (columns)")
    device, size = team.device, members.size
    counts = _counts(what, "input_split_sizes", input_split_sizes, size, device)
    caps = _counts(what, "output_split_sizes", output_split_sizes, size, device)
    land_at = torch.cumsum(caps, 0) - caps  # where each member's columns land: packed in member order
    span = input.shape[0] * input.stride(0) if input.shape[0] > 1 else input.numel()  # the buffer: alike
    return _exchange(ctx, group, async_op, config, members, output, input, counts, None, None, caps, land_at,
                     width=input.shape[0], available=input.shape[1], capacity=output.shape[1],
                     span=span, strides=(input.stride(0), output.stride(0)))


def _exchange(ctx, group, async_op, config, members, output, input, counts, send_at, received, caps, land_at,
              width: int, available: int, capacity: int, span: int, strides: tuple | None = None):
    """The launches of both forms: publish this member's counts, then pull (rows of ``width`` elements, or with
    ``strides`` blocks of columns of ``width`` rows, that many elements apart in input and output). ``span``:
    elements that size the launch, alike on every member (the symmetric input buffer's)."""
    # the table: (rows, first row) from each rank, in the heap's reserved tail. Never zeroed: every member
    # writes its slot (its rank's) on every member before the barrier that the reads follow (a fill here would
    # race with a faster member's writes, which nothing orders before it)
    table = ctx.team.region("ccl.a2av_table")
    size = members.size
    publish = bind(_publish_kernel, (1,), counts, counts if send_at is None else send_at, available, table,
                   members.tensor, size, ctx.get_rank(), ctx.get_heap_bases(), WORLD=triton.next_power_of_2(size),
                   DISPLS=send_at is not None)
    publish()
    programs = max(1, min(PROGRAMS, triton.cdiv(span, config.block_size)))
    return [publish] + _common.run(ctx, group, async_op, _common.fuse(config, span * input.element_size()),
                                   _all_to_all_v_kernel, programs,
                                   input, output, width, capacity, *(strides or (0, 0)), table,
                                   table if received is None else received, table if caps is None else caps,
                                   table if land_at is None else land_at, members.tensor, size, members.index,
                                   ctx.get_rank(), ctx.get_heap_bases(), RECEIVED=received is not None,
                                   CAPS=caps is not None, DISPLS=land_at is not None, COLUMNS=strides is not None,
                                   MEMBERS=triton.next_power_of_2(size), BLOCK=config.block_size)
