"""MoE dispatch and combine: each token's hidden state to the ranks of its top-k experts, and the weighted sum of
the experts' outputs back, with every count on the device (nothing waits on the host).

The API: ``dispatcher = ctx.ccl.moe_dispatcher(hidden_dim=..., num_experts=..., topk=...,
max_tokens=...)``; ``recv, local_meta, handle = dispatcher.dispatch(tokens, topk_idx, topk_weight)`` gives this
rank's experts the tokens routed to them from every rank, grouped by local expert (expert e's rows at
``local_meta.offsets[e]`` to ``local_meta.offsets[e + 1]``, in source-rank order, then token order);
``dispatcher.combine(expert_out, handle)`` returns, for each of this rank's tokens in its order, the sum over
its top-k of weight x the expert's output row.

How: the (token, slot) pairs are sorted by expert on the device and one kernel packs their rows for the experts'
ranks and counts them; the rows go to those ranks, and the per-expert counts with them, by
:func:`iris.ccl.all_to_all_v` with device counts; on the receiver one kernel moves the rows that arrived into
expert order (it reads their counts on the device). Combine runs the same steps backwards; one kernel then sums
each token's k rows, weighted, in fp32 (no atomics). Experts are dealt to ranks in contiguous blocks of
``num_experts / W`` (expert e on rank e // (num_experts / W)). Buffers are made once, at their largest
(``max_tokens`` per rank): dispatch and combine allocate nothing on the heap and read no count on the host, so a
CUDA graph captures them (tests/test_cuda_graphs.py, on 2 x H200). An expert id outside ``[0, num_experts)``
drops its slot (sent nowhere, adds nothing in combine); in debug mode dispatch refuses it before any launch.

Example:
    >>> moe = ctx.ccl.moe_dispatcher(hidden_dim=7168, num_experts=256, topk=8, max_tokens=128)
    >>> recv, meta, handle = moe.dispatch(x, topk_idx, topk_weight)
    >>> out = torch.empty_like(recv)
    >>> for e in range(meta.counts.numel()):       # or one grouped GEMM over meta.offsets
    ...     rows = slice(meta.offsets[e], meta.offsets[e + 1])
    ...     out[rows] = experts[e](recv[rows])
    >>> y = moe.combine(out, handle)              # (tokens, hidden), weighted by topk_weight
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from iris.ccl import _common
from iris.ccl.config import CollectiveConfig
from iris.host.replay.relaunch import Relaunch

#: The most programs of the row kernels below; each takes every programs-th row (or piece).
MOVE_PROGRAMS = 1024
#: A dispatch of at most this many (token, slot) pairs sorts them by expert in one kernel of ours (one launch);
#: a larger one by torch.sort, whose several launches cost more host time (an eager dispatch of a few hundred
#: tokens waits on its host).
SORT_IN_KERNEL = 4096


@triton.jit
def _sort_kernel(ids, order, sorted_ids, pairs, experts, N: tl.constexpr, SHIFT: tl.constexpr):
    """One program: ``order`` = the pairs ``0 .. pairs - 1`` sorted by their expert id ``ids[pair]``, stably,
    every id outside ``[0, experts)`` after the rest as ``experts``; ``sorted_ids[r]`` = the id of ``order[r]``.
    The keys sorted are (id, pair) in one int64, the pair in the low SHIFT bits (``N = 2**SHIFT > pairs``): all
    distinct, so the order is stable."""
    lanes = tl.arange(0, N)
    inside = lanes < pairs
    e = tl.load(ids + lanes, mask=inside, other=0).to(tl.int64)
    bucket = tl.where(inside, tl.where((e >= 0) & (e < experts), e, experts), experts + 1)
    keys = tl.sort((bucket << SHIFT) | lanes)
    tl.store(order + lanes, keys & (N - 1), mask=inside)
    tl.store(sorted_ids + lanes, keys >> SHIFT, mask=inside)


@triton.jit
def _lower_bound(sorted_ids, n, values, STEPS: tl.constexpr):
    """For each of ``values``: how many of the ``n`` ascending ``sorted_ids`` are below it (a binary search of
    STEPS halvings; ``2**STEPS > n``)."""
    lo = values * 0
    hi = lo + n
    for _ in tl.static_range(STEPS):
        open_ = lo < hi
        mid = (lo + hi) // 2
        below = tl.load(sorted_ids + mid, mask=open_, other=0) < values
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & below, hi, tl.where(open_, mid, hi))
    return lo


@triton.jit
def _copy_row(src, dst, source, target, hidden, BLOCK: tl.constexpr):
    """``dst[target] = src[source]``, rows of ``hidden`` elements."""
    cols = tl.arange(0, BLOCK)
    for start in range(0, hidden, BLOCK):
        inside = start + cols < hidden
        tl.store(dst + tl.cast(target, tl.int64) * hidden + start + cols,
                 tl.load(src + tl.cast(source, tl.int64) * hidden + start + cols, mask=inside), mask=inside)


@triton.jit
def _round_to_e4m3(value):
    """``value`` (fp32, at most 448 in magnitude) rounded to the nearest float8 e4m3 value, ties to even, still
    fp32: the cast to e4m3 that follows is then exact whatever its own rounding (Triton's interpreter does not
    carry a round-up into the exponent: 1.95 became 1.0). Normal values keep 3 mantissa bits; below 2**-6 the
    step is 2**-9 (fp32's addition of 1.5 * 2**14 rounds to it)."""
    bits = value.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
    subnormal = (value + 24576.0) - 24576.0
    return tl.where(tl.abs(value) < 0.015625, subnormal, normal)


@triton.jit
def _quantize_row(src, dst, scales, source, target, hidden, BLOCK: tl.constexpr):
    """``dst[target] = src[source] / scale`` as float8 e4m3 and ``scales[target] = scale``, where scale is the
    row's largest magnitude over e4m3's largest finite value, 448 (1 for a row of zeros)."""
    cols = tl.arange(0, BLOCK)
    row = src + tl.cast(source, tl.int64) * hidden
    largest = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, hidden, BLOCK):
        inside = start + cols < hidden
        largest = tl.maximum(largest, tl.abs(tl.load(row + start + cols, mask=inside, other=0).to(tl.float32)))
    amax = tl.max(largest, 0)
    scale = tl.where(amax > 0, amax / 448.0, 1.0)
    tl.store(scales + target, scale)
    out = dst + tl.cast(target, tl.int64) * hidden
    for start in range(0, hidden, BLOCK):
        inside = start + cols < hidden
        value = tl.load(row + start + cols, mask=inside, other=0).to(tl.float32) / scale
        tl.store(out + start + cols, _round_to_e4m3(tl.clamp(value, -448.0, 448.0)).to(out.dtype.element_ty),
                 mask=inside)


@triton.jit
def _pack_kernel(tokens, order, sorted_ids, outgoing, scales, inverse, counts, sent, pairs, hidden, local_experts,
                 ranks, K: tl.constexpr, EXPERTS: tl.constexpr, RANKS: tl.constexpr, STEPS: tl.constexpr,
                 FP8: tl.constexpr, BLOCK: tl.constexpr):
    """The sender's side of a dispatch, after its (token, slot) pairs were sorted by expert (``order``, the pairs;
    ``sorted_ids``, their expert ids: expert e's pairs are those from the first id at or above e to the first at
    or above e + 1, found by binary search of STEPS halvings): row r of ``outgoing`` = the token of pair
    ``order[r]``, ``inverse[order[r]] = r``; program 0 also writes the rows for each expert (``counts``, (ranks,
    local_experts) flat) and for each rank (``sent``). ``EXPERTS``, ``RANKS``: the counts rounded up to powers of
    two."""
    experts = local_experts * ranks
    if tl.program_id(0) == 0:
        e = tl.arange(0, EXPERTS)
        inside = e < experts
        begin = _lower_bound(sorted_ids, pairs, e, STEPS)
        tl.store(counts + e, (_lower_bound(sorted_ids, pairs, e + 1, STEPS) - begin).to(counts.dtype.element_ty),
                 mask=inside)
        w = tl.arange(0, RANKS)
        first = _lower_bound(sorted_ids, pairs, w * local_experts, STEPS)
        last = _lower_bound(sorted_ids, pairs, (w + 1) * local_experts, STEPS)
        tl.store(sent + w, (last - first).to(sent.dtype.element_ty), mask=w < ranks)
    # pairs of expert ids outside [0, experts) sort before or after the rest: dropped
    bounds = _lower_bound(sorted_ids, pairs, tl.arange(0, 2) * experts, STEPS)
    base = tl.min(bounds, 0)
    end = tl.max(bounds, 0)
    for r in range(tl.program_id(0), pairs, tl.num_programs(0)):
        pair = tl.load(order + r)
        if (r >= base) & (r < end):
            tl.store(inverse + pair, r - base)
            if FP8:
                _quantize_row(tokens, outgoing, scales, pair // K, r - base, hidden, BLOCK)
            else:
                _copy_row(tokens, outgoing, pair // K, r - base, hidden, BLOCK)
        else:
            tl.store(inverse + pair, -1)


@triton.jit
def _regroup_kernel(src, dst, src_scales, dst_scales, counts, kept_counts, expert_counts, offsets, row_counts, hidden,
                    local_experts, ranks, TO_EXPERTS: tl.constexpr, SCALES: tl.constexpr, RANKS: tl.constexpr,
                    LOCAL: tl.constexpr, BLOCK: tl.constexpr):
    """Rows as they arrive (by source rank, each source's by local expert; ``counts[s, e]`` rows of (source s,
    expert e)) to rows grouped by expert (each expert's by source), or back with TO_EXPERTS False. Program 0
    also writes, grouping, each expert's rows (``expert_counts``), their ``offsets`` (one more entry: the
    total) and a copy of ``counts`` (``kept_counts``, the dispatch's own), and, going back, the rows of each
    source (``row_counts``). With SCALES (grouping only) each row's
    scale moves with it, from ``src_scales`` to ``dst_scales``. The programs share the rows: a hot expert is
    spread over all of them."""
    s = tl.arange(0, RANKS)[:, None]
    e = tl.arange(0, LOCAL)[None, :]
    c = tl.load(counts + s * local_experts + e, mask=(s < ranks) & (e < local_experts), other=0).to(tl.int64)
    per_source = tl.sum(c, 1)
    per_expert = tl.sum(c, 0)
    arrival = (tl.cumsum(per_source, 0) - per_source)[:, None] + tl.cumsum(c, 1) - c  # by source, then expert
    grouped = (tl.cumsum(per_expert, 0) - per_expert)[None, :] + tl.cumsum(c, 0) - c  # by expert, then source
    if tl.program_id(0) == 0:
        if TO_EXPERTS:
            x = tl.arange(0, LOCAL)
            tl.store(kept_counts + s * local_experts + e, c.to(kept_counts.dtype.element_ty),
                     mask=(s < ranks) & (e < local_experts))
            tl.store(expert_counts + x, per_expert, mask=x < local_experts)
            tl.store(offsets + x + 1, tl.cumsum(per_expert, 0), mask=x < local_experts)
            tl.store(offsets + x, 0, mask=x == 0)
        else:
            tl.store(row_counts + tl.arange(0, RANKS), per_source, mask=tl.arange(0, RANKS) < ranks)
    # the (source, expert) segments in arrival order, flat: padding segments are empty and start where the next
    # real one does, so row r lies in the last segment that starts at or before it
    segment = tl.arange(0, RANKS * LOCAL)
    came = tl.reshape(arrival, [RANKS * LOCAL])
    goes = tl.reshape(grouped, [RANKS * LOCAL])
    for r in range(tl.program_id(0), tl.sum(per_source, 0), tl.num_programs(0)):
        here = segment == tl.sum((came <= r).to(tl.int32), 0) - 1
        moved = r - tl.sum(tl.where(here, came, 0), 0) + tl.sum(tl.where(here, goes, 0), 0)
        if TO_EXPERTS:
            _copy_row(src, dst, r, moved, hidden, BLOCK)
            if SCALES:
                tl.store(dst_scales + moved, tl.load(src_scales + r))
        else:
            _copy_row(src, dst, moved, r, hidden, BLOCK)


def _programs(ctx, work: int) -> int:
    """Programs of a row kernel: one where a launch's programs run in turn (more only cost time), else one per
    piece of ``work`` up to MOVE_PROGRAMS."""
    return 1 if ctx.team.backend.runs_programs_in_turn else max(1, min(MOVE_PROGRAMS, work))


def _row_block(hidden: int) -> int:
    return min(1024, triton.next_power_of_2(hidden))


@triton.jit
def _combine_kernel(returned, inverse, weights, out, tokens, hidden, K: tl.constexpr, BLOCK: tl.constexpr):
    """``out[t] = sum over slots s of weights[t*K + s] * returned[inverse[t*K + s]]`` for the first ``tokens``
    tokens, summed in fp32 in slot order (no atomics: each program owns its (token, column block) pieces); a
    dropped slot (``inverse`` -1) adds nothing."""
    cols = tl.arange(0, BLOCK)
    blocks = tl.cdiv(hidden, BLOCK)
    for piece in range(tl.program_id(0), tokens * blocks, tl.num_programs(0)):
        token = piece // blocks
        start = (piece % blocks) * BLOCK
        inside = start + cols < hidden
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for slot in range(K):
            flat = token * K + slot
            row = tl.load(inverse + flat).to(tl.int64)
            kept = row >= 0
            weight = tl.where(kept, tl.load(weights + flat).to(tl.float32), 0.0)
            total += weight * tl.load(returned + row * hidden + start + cols, mask=inside & kept,
                                      other=0).to(tl.float32)
        tl.store(out + tl.cast(token, tl.int64) * hidden + start + cols, total.to(out.dtype.element_ty),
                 mask=inside)


@dataclass
class MoEDispatchConfig:
    """Launch sizes of the exchanges (elements per program of the all_to_all_v pulls)."""

    dispatch_block_size: int = 1024
    combine_block_size: int = 1024


@dataclass(frozen=True)
class LocalExperts:
    """This rank's experts after a dispatch: ``counts[e]`` rows for local expert e, from ``offsets[e]`` of the
    received tensor (``offsets`` has one more entry: the total). Device tensors, int64."""

    counts: torch.Tensor
    offsets: torch.Tensor
    #: with ``dispatch_dtype=torch.float8_e4m3fn``: (rows,) float32, received row i times ``scales[i]`` is the
    #: token (rows past ``offsets[-1]`` unused); else None
    scales: torch.Tensor | None = None


@dataclass(frozen=True)
class DispatchHandle:
    """What :meth:`MoEDispatcher.combine` needs of a dispatch (device tensors; opaque to the caller)."""

    inverse: torch.Tensor  # (T*k,) where (token, slot) pair f went in the rows sent (sorted by expert)
    weights: torch.Tensor  # (T*k,) the gating weights, flat in (token, slot) order
    counts: torch.Tensor  # (W, local experts) rows received from each rank for each local expert
    tokens: int


class MoEDispatcher:
    """Dispatch and combine for expert parallelism over the ranks of a context; see :mod:`iris.ccl.moe`.

    Args:
        ctx: the Iris context (every rank makes its dispatcher alike: collective, allocates heap buffers).
        hidden_dim: elements of a token's hidden state.
        num_experts: experts over all ranks, a multiple of the number of ranks.
        topk: experts per token.
        max_tokens: the most tokens a rank dispatches in one call.
        group: None (every rank); groups are not supported yet.
        config: a :class:`MoEDispatchConfig`.
        expt_assignment: None (contiguous blocks of experts per rank); other assignments are not supported yet.
        dtype: the tokens' dtype (bfloat16 by default), and the dtype of the experts' outputs combine takes.
        dispatch_dtype: None (the rows travel in ``dtype``) or ``torch.float8_e4m3fn``: each row travels as fp8
            divided by a scale of its own (its largest magnitude / 448), half the bytes of bfloat16; dispatch then
            returns fp8 rows and their scales in ``local_meta.scales``.
    """

    def __init__(self, ctx, hidden_dim: int, num_experts: int, topk: int, max_tokens: int, group=None,
                 config: MoEDispatchConfig | None = None, expt_assignment=None, dtype=torch.bfloat16,
                 dispatch_dtype=None):
        world = ctx.get_num_ranks()
        what = "moe_dispatcher"
        for name, value in (("hidden_dim", hidden_dim), ("num_experts", num_experts), ("topk", topk),
                            ("max_tokens", max_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{what}: {name}={value!r} must be a positive int")
        if num_experts % world:
            raise ValueError(f"{what}: num_experts={num_experts} must be a multiple of the {world} ranks (each rank "
                             f"holds num_experts / {world} experts)")
        if topk > num_experts:
            raise ValueError(f"{what}: topk={topk} is more than num_experts={num_experts}")
        if group is not None or expt_assignment is not None:
            raise NotImplementedError(f"{what}: groups and expert assignments other than contiguous blocks are not "
                                      f"supported yet")
        if dtype not in _common.MOVE_DTYPES:
            raise TypeError(f"{what}: dtype {dtype} is not one the collectives move")
        if dispatch_dtype not in (None, dtype, torch.float8_e4m3fn):
            raise TypeError(f"{what}: dispatch_dtype {dispatch_dtype} must be None or torch.float8_e4m3fn")
        self.fp8 = dispatch_dtype == torch.float8_e4m3fn and dtype != torch.float8_e4m3fn
        self.config = config or MoEDispatchConfig()
        self._ctx, self.hidden_dim, self.num_experts, self.topk = ctx, hidden_dim, num_experts, topk
        self.max_tokens, self.dtype, self.world = max_tokens, dtype, world
        self.local_experts = num_experts // world
        device = ctx.get_device()
        sent_rows, received_rows = max_tokens * topk, world * max_tokens * topk
        # on the heap: what the peers pull from (all_to_all_v's input), allocated alike on every rank
        wire = torch.float8_e4m3fn if self.fp8 else dtype  # what the rows travel as
        self._outgoing = ctx.empty((sent_rows, hidden_dim), dtype=wire)
        self._returning = ctx.empty((received_rows, hidden_dim), dtype=dtype)
        self._counts_out = ctx.empty((world, self.local_experts), dtype=torch.int32)
        # this rank's own
        self._incoming = torch.empty(received_rows, hidden_dim, dtype=wire, device=device)
        self._grouped = torch.empty_like(self._incoming)
        # fp8: a scale per row, travelling beside it (all_to_all_v's input on the heap too)
        scale_rows = (sent_rows, received_rows) if self.fp8 else (1, 1)
        self._scales_out = ctx.empty((scale_rows[0], 1), dtype=torch.float32)
        self._scales_in = torch.empty(scale_rows[1], 1, dtype=torch.float32, device=device)
        self._scales_grouped = torch.empty_like(self._scales_in)
        self._returned = torch.empty(sent_rows, hidden_dim, dtype=dtype, device=device)
        self._counts_in = torch.empty(world, self.local_experts, dtype=torch.int32, device=device)
        # the counts of the row exchanges live in buffers of their own, so that every call passes the same
        # tensors and ctx.ccl replays its launches (iris.host.replay) instead of preparing them again
        self._sent = torch.empty(world, dtype=torch.int64, device=device)
        self._returned_counts = torch.empty(world, dtype=torch.int64, device=device)
        self._one_row_each = torch.ones(world, dtype=torch.int64, device=device)
        # the sort of (token, slot) pairs by expert (_sort_by_expert): in one kernel up to SORT_IN_KERNEL pairs,
        # into buffers of its own (only the pack kernel reads them)
        self._sorted_in_kernel = min(sent_rows, SORT_IN_KERNEL)
        self._order = torch.empty(self._sorted_in_kernel, dtype=torch.int64, device=device)
        self._sorted_ids = torch.empty_like(self._order)
        self._sorts: dict[int, Relaunch] = {}  # lanes (pairs rounded up to a power of two) -> its launch
        # made once (a Config checks its fields when made): an eager call's host time is most of its time at a
        # few hundred tokens (at 128 tokens on 2 x H200 the GPU waited on the host)
        self._dispatch_config = CollectiveConfig(block_size=self.config.dispatch_block_size)
        self._combine_config = CollectiveConfig(block_size=self.config.combine_block_size)
        # the kernels' launches, their constexprs fixed: each call's tensors and counts go to the compiled kernel
        # without Triton's per-call Python (iris.host.replay.relaunch)
        block, ranks = _row_block(hidden_dim), triton.next_power_of_2(world)
        local = triton.next_power_of_2(self.local_experts)
        self._pack = Relaunch(_pack_kernel, K=topk, EXPERTS=triton.next_power_of_2(num_experts), RANKS=ranks,
                              STEPS=sent_rows.bit_length(), FP8=self.fp8, BLOCK=block, num_warps=4)
        self._regroup_launches = {to_experts: Relaunch(_regroup_kernel, TO_EXPERTS=to_experts,
                                                       SCALES=self.fp8 and to_experts, RANKS=ranks, LOCAL=local,
                                                       BLOCK=block, num_warps=4) for to_experts in (True, False)}
        self._combine_launch = Relaunch(_combine_kernel, K=topk, BLOCK=block, num_warps=4)

    def dispatch(self, tokens: torch.Tensor, topk_idx: torch.Tensor, topk_weight: torch.Tensor):
        """``(recv, local_meta, handle)``: the tokens routed to this rank's experts, grouped by expert (a view of
        a buffer with room for every token of every rank; rows past ``local_meta.offsets[-1]`` are unused), their
        counts and offsets (:class:`LocalExperts`), and the handle for :meth:`combine`.

        Args:
            tokens: (T, hidden_dim) of the dispatcher's dtype, T <= max_tokens.
            topk_idx: (T, topk) integer expert ids in [0, num_experts).
            topk_weight: (T, topk) gating weights (any float dtype).
        """
        tokens_n = self._check(tokens, topk_idx, topk_weight)
        ctx = self._ctx
        flat = topk_idx.reshape(-1)
        pairs = flat.numel()
        order, sorted_ids = self._sort_by_expert(flat)
        inverse = torch.empty(pairs, dtype=torch.int64, device=flat.device)
        self._pack((_programs(ctx, pairs),), tokens, order, sorted_ids, self._outgoing, self._scales_out, inverse,
                   self._counts_out, self._sent, pairs, self.hidden_dim, self.local_experts, self.world)
        config = self._dispatch_config
        # the counts first: row r of counts_out (this rank's rows for rank r's experts) to rank r
        ctx.ccl.all_to_all_v(self._counts_in, self._counts_out, self._one_row_each, config=config)
        ctx.ccl.all_to_all_v(self._incoming, self._outgoing, self._sent, config=config)
        if self.fp8:
            ctx.ccl.all_to_all_v(self._scales_in, self._scales_out, self._sent, config=config)
        # this dispatch's own counts and offsets, written by the regrouping kernel (no copies launched)
        kept = torch.empty_like(self._counts_in)
        expert_counts = torch.empty(self.local_experts, dtype=torch.int64, device=kept.device)
        offsets = torch.empty(self.local_experts + 1, dtype=torch.int64, device=kept.device)
        self._regroup(self._incoming, self._grouped, self._counts_in, to_experts=True, kept=kept,
                      expert_counts=expert_counts, offsets=offsets)
        handle = DispatchHandle(inverse=inverse, weights=topk_weight.reshape(-1).contiguous(), counts=kept,
                                tokens=tokens_n)
        meta = LocalExperts(counts=expert_counts, offsets=offsets,
                            scales=self._scales_grouped[:, 0] if self.fp8 else None)
        return self._grouped, meta, handle

    def combine(self, expert_out: torch.Tensor, handle: DispatchHandle) -> torch.Tensor:
        """(T, hidden_dim): for each token of the dispatch, the sum over its top-k of weight x its expert's row
        of ``expert_out`` (rows in the order :meth:`dispatch` returned them; at least ``offsets[-1]`` of them)."""
        if not isinstance(handle, DispatchHandle):
            raise TypeError(f"combine: handle must be what dispatch returned, got {type(handle).__name__}")
        if expert_out.dim() != 2 or expert_out.shape[1] != self.hidden_dim or \
                expert_out.shape[0] != self._grouped.shape[0] or expert_out.device != self._grouped.device:
            raise ValueError(f"combine: expert_out must be ({self._grouped.shape[0]}, {self.hidden_dim}) on "
                             f"{self._grouped.device}, the shape dispatch returned; got {tuple(expert_out.shape)} "
                             f"on {expert_out.device}")
        # back into the order the rows were received in (the rows that arrived only: nothing waits on the host);
        # the kernel also writes how many rows go back to each rank
        self._regroup(expert_out.to(self.dtype).contiguous(), self._returning, handle.counts, to_experts=False)
        self._ctx.ccl.all_to_all_v(self._returned, self._returning, self._returned_counts,
                                   config=self._combine_config)
        out = torch.empty(handle.tokens, self.hidden_dim, dtype=self.dtype, device=self._returned.device)
        programs = _programs(self._ctx, handle.tokens * triton.cdiv(self.hidden_dim, _row_block(self.hidden_dim)))
        self._combine_launch((programs,), self._returned, handle.inverse, handle.weights, out, handle.tokens,
                             self.hidden_dim)
        return out

    def _sort_by_expert(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(order, sorted_ids)``: the (token, slot) pairs of ``flat`` (their expert ids) sorted by expert, stably
        (a token's slots in slot order), and their ids in that order; ids outside ``[0, num_experts)`` sort
        before or after the rest. The first ``flat.numel()`` entries count."""
        pairs = flat.numel()
        if 0 < pairs <= self._sorted_in_kernel:
            lanes = max(2, triton.next_power_of_2(pairs))
            sort = self._sorts.get(lanes)
            if sort is None:
                sort = self._sorts[lanes] = Relaunch(_sort_kernel, N=lanes, SHIFT=lanes.bit_length() - 1,
                                                     num_warps=4 if lanes <= 1024 else 8)
            sort((1,), flat, self._order, self._sorted_ids, pairs, self.num_experts)
            return self._order, self._sorted_ids
        sorted_ids, order = torch.sort(flat.to(torch.int64), stable=True)
        return order, sorted_ids

    def _regroup(self, src: torch.Tensor, dst: torch.Tensor, counts: torch.Tensor, to_experts: bool,
                 kept=None, expert_counts=None, offsets=None) -> None:
        """:func:`_regroup_kernel`: the received rows by expert (to_experts: ``kept``, ``expert_counts`` and
        ``offsets`` get this dispatch's counts), or back by source rank."""
        unused = self._returned_counts  # what the other direction's outputs point at (never written)
        self._regroup_launches[to_experts](
            (_programs(self._ctx, self._incoming.shape[0]),), src, dst, self._scales_in, self._scales_grouped, counts,
            unused if kept is None else kept, unused if expert_counts is None else expert_counts,
            unused if offsets is None else offsets, self._returned_counts, self.hidden_dim, self.local_experts,
            self.world)

    def _check(self, tokens, topk_idx, topk_weight) -> int:
        what = "dispatch"
        if tokens.dim() != 2 or tokens.shape[1] != self.hidden_dim or tokens.dtype != self.dtype:
            raise ValueError(f"{what}: tokens must be (T, {self.hidden_dim}) {self.dtype}; got {tuple(tokens.shape)} "
                             f"{tokens.dtype}")
        if tokens.shape[0] > self.max_tokens:
            raise ValueError(f"{what}: {tokens.shape[0]} tokens, more than max_tokens={self.max_tokens}")
        want = (tokens.shape[0], self.topk)
        if tuple(topk_idx.shape) != want or tuple(topk_weight.shape) != want:
            raise ValueError(f"{what}: topk_idx and topk_weight must be {want}; got {tuple(topk_idx.shape)} and "
                             f"{tuple(topk_weight.shape)}")
        if topk_idx.dtype.is_floating_point or topk_idx.dtype == torch.bool:
            raise TypeError(f"{what}: topk_idx must hold integer expert ids, got {topk_idx.dtype}")
        for name, t in (("tokens", tokens), ("topk_idx", topk_idx), ("topk_weight", topk_weight)):
            if t.device != self._grouped.device:
                raise ValueError(f"{what}: {name} is on {t.device}, this rank's buffers on {self._grouped.device}")
        if self._ctx.team.debug:  # reads the ids on the host: debug mode only
            outside = (topk_idx < 0) | (topk_idx >= self.num_experts)
            if bool(outside.any()):
                raise ValueError(f"{what}: topk_idx holds {int(outside.sum())} expert ids outside [0, "
                                 f"{self.num_experts}), e.g. {int(topk_idx[outside][0])} (outside debug mode such a "
                                 f"slot is dropped: it is sent nowhere and adds nothing in combine)")
        return tokens.shape[0]
