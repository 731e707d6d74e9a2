"""MoE dispatch and combine: each token's hidden state to the ranks of its top-k experts, and the weighted sum of
the experts' outputs back, with every count on the device (nothing waits on the host).

The original's API: ``dispatcher = ctx.ccl.moe_dispatcher(hidden_dim=..., num_experts=..., topk=...,
max_tokens=...)``; ``recv, local_meta, handle = dispatcher.dispatch(tokens, topk_idx, topk_weight)`` gives this
rank's experts the tokens routed to them from every rank, grouped by local expert (expert e's rows at
``local_meta.offsets[e]`` to ``local_meta.offsets[e + 1]``, in source-rank order, then token order);
``dispatcher.combine(expert_out, handle)`` returns, for each of this rank's tokens in its order, the sum over
its top-k of weight x the expert's output row.

How: the (token, slot) pairs are sorted by expert on the device; their rows go to the experts' ranks, and the
per-expert counts with them, by :func:`iris.ccl.all_to_all_v` with device counts; the receiver regroups them by
expert with a permutation it computes on the device, moving only the rows that arrived (a kernel reads their
count on the device). Combine runs the same steps backwards; one kernel then sums each token's k rows, weighted, in
fp32 (no atomics). Experts are dealt to
ranks in contiguous blocks of ``num_experts / W`` (expert e on rank e // (num_experts / W)). Buffers are made
once, at their largest (``max_tokens`` per rank): dispatch and combine allocate nothing on the heap and read no
count on the host, so a CUDA graph captures them (tests/test_cuda_graphs.py, on 2 x H200).

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
from iris.ccl.config import Config

#: The most programs of a row move (:func:`_move_rows`); each takes every programs-th row.
MOVE_PROGRAMS = 1024


@triton.jit
def _move_rows_kernel(src, dst, places, total, hidden, GATHER: tl.constexpr, BLOCK: tl.constexpr):
    """For each row r below the device count ``total[0]``: ``dst[places[r]] = src[r]``, or with GATHER
    ``dst[r] = src[places[r]]``; rows from ``total[0]`` on are left as they are."""
    cols = tl.arange(0, BLOCK)
    for row in range(tl.program_id(0), tl.load(total), tl.num_programs(0)):
        place = tl.load(places + row)
        source = tl.where(GATHER, place, row).to(tl.int64) * hidden
        target = tl.where(GATHER, row, place).to(tl.int64) * hidden
        for start in range(0, hidden, BLOCK):
            inside = start + cols < hidden
            tl.store(dst + target + start + cols, tl.load(src + source + start + cols, mask=inside), mask=inside)


def _move_rows(ctx, src: torch.Tensor, dst: torch.Tensor, places: torch.Tensor, total: torch.Tensor,
               gather: bool) -> None:
    """:func:`_move_rows_kernel` over the first ``total`` (a device scalar) rows: the work follows the rows that
    arrived, not the buffers' capacity (which is every rank's max_tokens x topk), and the host reads no count."""
    hidden = src.shape[1]  # (rows, hidden) either way
    programs = 1 if ctx.team.backend.interpreted else max(1, min(MOVE_PROGRAMS, places.numel()))
    _move_rows_kernel[(programs,)](src, dst, places, total.reshape(1), hidden, GATHER=gather,
                                   BLOCK=min(1024, triton.next_power_of_2(hidden)), num_warps=4)


@triton.jit
def _combine_kernel(returned, inverse, weights, out, tokens, hidden, K: tl.constexpr, BLOCK: tl.constexpr):
    """``out[t] = sum over slots s of weights[t*K + s] * returned[inverse[t*K + s]]`` for the first ``tokens``
    tokens, summed in fp32 in slot order (no atomics: each program owns its (token, column block) pieces)."""
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
            weight = tl.load(weights + flat).to(tl.float32)
            total += weight * tl.load(returned + row * hidden + start + cols, mask=inside, other=0).to(tl.float32)
        tl.store(out + tl.cast(token, tl.int64) * hidden + start + cols, total.to(out.dtype.element_ty),
                 mask=inside)


def _combine(ctx, returned: torch.Tensor, inverse: torch.Tensor, weights: torch.Tensor, tokens: int,
             topk: int) -> torch.Tensor:
    """:func:`_combine_kernel`: (tokens, hidden) in ``returned``'s dtype."""
    hidden = returned.shape[1]
    out = torch.empty(tokens, hidden, dtype=returned.dtype, device=returned.device)
    block = min(1024, triton.next_power_of_2(hidden))
    pieces = tokens * triton.cdiv(hidden, block)
    programs = 1 if ctx.team.backend.interpreted else max(1, min(MOVE_PROGRAMS, pieces))
    _combine_kernel[(programs,)](returned, inverse, weights, out, tokens, hidden, K=topk, BLOCK=block, num_warps=4)
    return out


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


@dataclass(frozen=True)
class DispatchHandle:
    """What :meth:`MoEDispatcher.combine` needs of a dispatch (device tensors; opaque to the caller)."""

    inverse: torch.Tensor  # (T*k,) where (token, slot) pair f went in the rows sent (sorted by expert)
    weights: torch.Tensor  # (T*k,) the gating weights, flat in (token, slot) order
    sent: torch.Tensor  # (W,) rows sent to each rank
    received: torch.Tensor  # (W,) rows received from each rank
    places: torch.Tensor  # (capacity,) received row i is row places[i] of the grouped tensor
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
        dtype: the tokens' dtype (bfloat16 by default).
    """

    def __init__(self, ctx, hidden_dim: int, num_experts: int, topk: int, max_tokens: int, group=None,
                 config: MoEDispatchConfig | None = None, expt_assignment=None, dtype=torch.bfloat16):
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
        self.config = config or MoEDispatchConfig()
        self._ctx, self.hidden_dim, self.num_experts, self.topk = ctx, hidden_dim, num_experts, topk
        self.max_tokens, self.dtype, self.world = max_tokens, dtype, world
        self.local_experts = num_experts // world
        device = ctx.get_device()
        sent_rows, received_rows = max_tokens * topk, world * max_tokens * topk
        # on the heap: what the peers pull from (all_to_all_v's input), allocated alike on every rank
        self._outgoing = ctx.empty((sent_rows, hidden_dim), dtype=dtype)
        self._returning = ctx.empty((received_rows, hidden_dim), dtype=dtype)
        self._counts_out = ctx.empty((world, self.local_experts), dtype=torch.int32)
        # this rank's own
        self._incoming = torch.empty(received_rows, hidden_dim, dtype=dtype, device=device)
        self._grouped = torch.empty_like(self._incoming)
        self._returned = torch.empty(sent_rows, hidden_dim, dtype=dtype, device=device)
        self._counts_in = torch.empty(world, self.local_experts, dtype=torch.int32, device=device)
        self._received = torch.empty(world, dtype=torch.int64, device=device)
        # the counts of the row exchanges live in buffers of their own, so that every call passes the same
        # tensors and ctx.ccl replays its launches (iris.replay) instead of preparing them again
        self._sent = torch.empty(world, dtype=torch.int64, device=device)
        self._returned_counts = torch.empty(world, dtype=torch.int64, device=device)
        self._one_row_each = torch.ones(world, dtype=torch.int64, device=device)
        self._rows = torch.arange(received_rows, device=device)

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
        ctx, k, experts = self._ctx, self.topk, self.num_experts
        flat = topk_idx.reshape(-1).to(torch.int64)
        pairs = flat.numel()
        order = torch.argsort(flat, stable=True)  # by expert; a token's slots in slot order
        inverse = torch.empty_like(order).index_copy_(0, order, self._rows[:pairs])
        per_expert = torch.zeros(experts, dtype=torch.int64, device=flat.device).scatter_add_(
            0, flat, torch.ones_like(flat))
        per_rank = per_expert.view(self.world, self.local_experts)
        torch.sum(per_rank, 1, out=self._sent)
        torch.index_select(tokens, 0, order // k, out=self._outgoing[:pairs])
        self._counts_out.copy_(per_rank)
        config = Config(block_size=self.config.dispatch_block_size)
        # the counts first: row r of counts_out (this rank's rows for rank r's experts) to rank r
        ctx.ccl.all_to_all_v(self._counts_in, self._counts_out, self._one_row_each, config=config)
        ctx.ccl.all_to_all_v(self._incoming, self._outgoing, self._sent, recv_counts=self._received, config=config)
        arrived = self._counts_in.to(torch.int64)  # [source, local expert]
        places = self._places(arrived)
        counts = arrived.sum(0)
        _move_rows(ctx, self._incoming, self._grouped, places, counts.sum(), gather=False)
        offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        handle = DispatchHandle(inverse=inverse, weights=topk_weight.reshape(-1).contiguous(), sent=self._sent.clone(),
                                received=self._received.clone(), places=places, tokens=tokens_n)
        return self._grouped, LocalExperts(counts=counts, offsets=offsets), handle

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
        # back into the order the rows were received in (the rows that arrived only: nothing waits on the host)
        _move_rows(self._ctx, expert_out.to(self.dtype).contiguous(), self._returning, handle.places,
                   handle.received.sum(), gather=True)
        self._returned_counts.copy_(handle.received)
        config = Config(block_size=self.config.combine_block_size)
        self._ctx.ccl.all_to_all_v(self._returned, self._returning, self._returned_counts, config=config)
        return _combine(self._ctx, self._returned, handle.inverse, handle.weights, handle.tokens, self.topk)

    def _places(self, counts: torch.Tensor) -> torch.Tensor:
        """Where each received row goes when grouped by expert: a permutation of the buffer's rows. Received
        rows come by source, each source's by expert; grouped, by expert, each expert's by source."""
        flat = counts.reshape(-1)  # segments (source, expert), in the order they arrived
        start = torch.cumsum(flat, 0) - flat
        by_expert = counts.t().reshape(-1)  # the same segments, (expert, source)
        grouped_start = (torch.cumsum(by_expert, 0) - by_expert).view(self.local_experts, self.world).t().reshape(-1)
        total = flat.sum()
        segment = torch.searchsorted(torch.cumsum(flat, 0), self._rows, right=True).clamp_(max=flat.numel() - 1)
        inside = self._rows < total
        return torch.where(inside, grouped_start[segment] + self._rows - start[segment], self._rows)

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
        return tokens.shape[0]
