"""MoE dispatch and combine (iris.ccl.moe) against a torch reference: random routing, empty experts, one hot
expert, top-k 1 to 8, bfloat16 and float32; every count stays on the device."""

import pytest
import torch

import iris
from iris.ccl import MoEDispatcher

HIDDEN = 24


def _routing(case, rank, tokens, experts, k, seed):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    if tokens == 0:
        return torch.zeros(0, HIDDEN), torch.zeros(0, k, dtype=torch.int64), torch.zeros(0, k)
    if case == "hot":  # expert 1 in every token's first slot, the rest random
        idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
        hot = (idx == 1).nonzero()
        idx[hot[:, 0], hot[:, 1]] = idx[hot[:, 0], 0]
        idx[:, 0] = 1
    elif case == "dropped":  # random, then some slots name no expert (-1, num_experts): dropped
        idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
        idx[::3, 0] = -1
        idx[1::4, k - 1] = experts
    elif case == "empty":  # only the even experts
        idx = torch.stack([torch.randperm(experts // 2, generator=g)[:k] * 2 for _ in range(tokens)])
    else:
        idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    x = torch.randn(tokens, HIDDEN, generator=g)
    w = torch.rand(tokens, k, generator=g)
    return x, idx, w


def _routed_to(data, expert, dtype) -> torch.Tensor:
    """The rows this rank's expert ``expert`` should get, as float: source by source, token by token, each
    token's slots for it (``data``: every rank's (tokens, topk_idx, topk_weight))."""
    rows = [x[t] for x, idx, _ in data for t in range(idx.shape[0]) for j in range(idx.shape[1])
            if int(idx[t, j]) == expert]
    return torch.stack(rows).to(dtype).float() if rows else torch.zeros(0, HIDDEN)


def _expert_scale(meta, experts, rows: int, device) -> torch.Tensor:
    """(rows, 1): expert e's rows of the dispatch scaled by e + 1 (what the tests' experts compute)."""
    scale = torch.zeros(rows, 1, device=device)
    for local, expert in enumerate(experts):
        scale[int(meta.offsets[local]):int(meta.offsets[local + 1])] = expert + 1
    return scale


def _round_trips(cases):
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    failures = []
    for seed, (case, per_rank, k, tokens, dtype) in enumerate(cases):
        experts = per_rank * world
        moe = ctx.ccl.moe_dispatcher(hidden_dim=HIDDEN, num_experts=experts, topk=k, max_tokens=16, dtype=dtype)
        assert isinstance(moe, MoEDispatcher)
        data = [_routing(case, r, tokens, experts, k, seed) for r in range(world)]
        x, idx, w = data[rank]
        recv, meta, handle = moe.dispatch(x.to(dtype).to(device), idx.to(device), w.to(device))
        # what this rank's experts should get: source by source, token by token, each token's rows for them
        mine = range(rank * per_rank, (rank + 1) * per_rank)
        for local, expert in enumerate(mine):
            want = _routed_to(data, expert, dtype)
            lo, hi = int(meta.offsets[local]), int(meta.offsets[local + 1])
            got = recv[lo:hi].float().cpu()
            if hi - lo != len(want) or not torch.equal(got, want):
                failures.append((case, k, "dispatch", expert, hi - lo, len(want)))
        # expert e scales its rows by e + 1; combine sums weight x that over the top-k
        y = moe.combine((recv.float() * _expert_scale(meta, mine, recv.shape[0], device)).to(dtype), handle)
        kept = (idx >= 0) & (idx < experts)  # a dropped slot adds nothing
        want = (x.to(dtype).float()[:, None, :] * (w * (idx + 1) * kept)[:, :, None]).sum(1)
        tolerance = 1e-5 if dtype == torch.float32 else 3e-2
        error = ((y.float().cpu() - want).norm() / want.norm().clamp_min(1e-9)).item()
        if error > tolerance:
            failures.append((case, k, "combine", error))
    ctx.close()
    return failures


def test_dispatch_and_combine_match_torch(ranks):
    for failures in ranks.run(_round_trips, [("random", 2, 2, 7, torch.float32), ("dropped", 2, 2, 9, torch.float32)]):
        assert failures == []


def _sorts(sizes):
    """The dispatcher's sort of (token, slot) pairs by expert, in its kernel (up to SORT_IN_KERNEL pairs) and by
    torch.sort above, against a stable sort of the ids with every id outside [0, experts) last."""
    from iris.ccl import moe as moe_module

    ctx = iris.iris(1 << 22)
    device = ctx.get_device()
    experts = 6 * ctx.get_num_ranks()
    failures = []
    limit = moe_module.SORT_IN_KERNEL
    for in_kernel in (True, False):
        moe_module.SORT_IN_KERNEL = limit if in_kernel else 0  # read when a dispatcher is made
        try:
            moe = ctx.ccl.moe_dispatcher(hidden_dim=8, num_experts=experts, topk=4, max_tokens=max(sizes))
        finally:  # the rank process serves later tests
            moe_module.SORT_IN_KERNEL = limit
        for tokens in sizes:
            g = torch.Generator().manual_seed(tokens)
            ids = torch.randint(-2, experts + 2, (tokens * 4,), generator=g)
            order, sorted_ids = moe._sort_by_expert(ids.to(device))
            kept = (ids >= 0) & (ids < experts)
            want_order = torch.sort(torch.where(kept, ids, experts), stable=True)[1]
            got_order, got_ids = order[:ids.numel()].cpu(), sorted_ids[:ids.numel()].cpu()
            valid = kept[got_order]  # the pairs in sorted order that go to an expert: one run, stably ordered
            runs = valid.nonzero().flatten()
            if not torch.equal(got_order.sort()[0], torch.arange(ids.numel())) or \
                    not torch.equal(got_order[valid], want_order[:int(kept.sum())]) or \
                    (runs.numel() and runs[-1] - runs[0] + 1 != runs.numel()) or \
                    not torch.equal(got_ids[valid], ids[got_order[valid]]) or \
                    bool(((got_ids[~valid] >= 0) & (got_ids[~valid] < experts)).any()):
                failures.append((in_kernel, tokens))
    ctx.close()
    return failures


@pytest.mark.parametrize("sizes", [[5, 64], pytest.param([1, 5, 64, 1024], marks=pytest.mark.slow)],
                         ids=["few", "all"])  # each size is a sort kernel of its own to compile (and 1024 runs long)
def test_pairs_sort_by_expert_stably_in_the_kernel_and_by_torch(ranks, sizes):
    for failures in ranks.run(_sorts, sizes):
        assert failures == []


@pytest.mark.slow
def test_dispatch_and_combine_with_empty_experts_a_hot_expert_and_topk_1_to_8(ranks):
    cases = [("random", 4, 1, 9, torch.float32), ("empty", 4, 2, 11, torch.bfloat16), ("hot", 4, 3, 5, torch.float32),
             ("random", 4, 8, 6, torch.bfloat16), ("random", 2, 2, 0, torch.float32), ("random", 3, 4, 16,
                                                                                         torch.float32)]
    for failures in ranks.run(_round_trips, cases):
        assert failures == []


def _misuse():
    from iris.testing import refusals

    ctx = iris.iris(1 << 22)
    world, device = ctx.get_num_ranks(), ctx.get_device()
    errors = refusals([
        lambda: ctx.ccl.moe_dispatcher(hidden_dim=8, num_experts=2 * world + 1, topk=2, max_tokens=4),
        lambda: ctx.ccl.moe_dispatcher(hidden_dim=8, num_experts=2 * world, topk=0, max_tokens=4),
    ])
    moe = ctx.ccl.moe_dispatcher(hidden_dim=8, num_experts=2 * world, topk=2, max_tokens=4, dtype=torch.float32)
    x = torch.zeros(5, 8, device=device)
    idx = torch.zeros(5, 2, dtype=torch.int64, device=device)
    errors += refusals([lambda: moe.dispatch(x, idx, idx.float()),                       # more than max_tokens
                        lambda: moe.dispatch(x[:4], idx[:4].float(), idx[:4].float())])  # float expert ids
    ctx.close()
    return errors


def test_misuse_is_refused_before_any_launch(ranks):
    for errors in ranks.run(_misuse):
        assert "multiple of the" in errors[0], errors
        assert "topk=0" in errors[1], errors
        assert "more than max_tokens=4" in errors[2], errors
        assert "integer expert ids" in errors[3], errors


def _fp8_round_trip(tokens, k, per_rank):
    """dispatch_dtype=float8_e4m3fn: the rows travel as fp8 with one scale per row; the receiver's rows times
    their scales are the tokens to fp8's precision, and combine (of bf16 expert outputs) sums them as before."""
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    experts = per_rank * world
    moe = ctx.ccl.moe_dispatcher(hidden_dim=HIDDEN, num_experts=experts, topk=k, max_tokens=16,
                                 dispatch_dtype=torch.float8_e4m3fn)
    sizes = torch.logspace(-2, 2, tokens)[:, None]  # rows of very different sizes: one scale each
    data = [(x * sizes, idx, w) for x, idx, w in (_routing("random", r, tokens, experts, k, 11) for r in range(world))]
    x, idx, w = data[rank]
    recv, meta, handle = moe.dispatch(x.to(torch.bfloat16).to(device), idx.to(device), w.to(device))
    failures = []
    if recv.dtype != torch.float8_e4m3fn or meta.scales is None or meta.scales.dtype != torch.float32:
        failures.append(("dtypes", recv.dtype, None if meta.scales is None else meta.scales.dtype))
    rows = recv.float() * meta.scales[:, None]
    spacing = (meta.scales[:, None] * 2.0 ** -9).cpu()  # e4m3's subnormal step, in each row's units
    mine = range(rank * per_rank, (rank + 1) * per_rank)
    for local, expert in enumerate(mine):
        want = _routed_to(data, expert, torch.bfloat16)
        lo, hi = int(meta.offsets[local]), int(meta.offsets[local + 1])
        got = rows[lo:hi].cpu()
        # to the nearest e4m3 value: half a step, 2^-4 relative (3 mantissa bits), or 2^-10 of the scale below 2^-6
        inside = bool(((got - want).abs() <= want.abs() / 16 + spacing[lo:hi] / 2).all()) if len(want) else True
        if hi - lo != len(want) or not inside:
            failures.append(("dispatch", expert, hi - lo, len(want)))
    y = moe.combine((rows * _expert_scale(meta, mine, recv.shape[0], device)).to(torch.bfloat16), handle)
    want = (x.to(torch.bfloat16).float()[:, None, :] * (w * (idx + 1))[:, :, None]).sum(1)
    error = ((y.float().cpu() - want).norm() / want.norm()).item()
    if error > 0.08:
        failures.append(("combine", error))
    ctx.close()
    return failures


@pytest.mark.slow
def test_fp8_dispatch_payload_with_a_scale_per_row(ranks):
    for failures in ranks.run(_fp8_round_trip, 12, 3, 2):
        assert failures == []
