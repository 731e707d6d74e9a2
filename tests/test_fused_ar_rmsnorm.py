"""ctx.ccl.all_reduce_rmsnorm: all-reduce, residual add and RMSNorm in one kernel, against torch."""

import pytest
import torch

import iris

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}
# The residual: within two units in the last place of its terms, as Triton's interpreter converts float32 to
# bf16 otherwise than torch (toward zero in the cases seen, where torch rounds to nearest).
ULP = {torch.float32: 0.0, torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10}


def _data(seed, rank, tokens, hidden, dtype):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    partial = torch.randn(tokens, hidden, generator=g).to(dtype)
    shared = torch.Generator().manual_seed(seed)  # the residual stream and the weight: the same on every rank
    residual = torch.randn(tokens, hidden, generator=shared).to(dtype)
    weight = (1 + 0.1 * torch.randn(hidden, generator=shared)).to(dtype)
    return partial, residual, weight


def _reference(seed, world, tokens, hidden, dtype, eps):
    """torch: the sum over ranks (rounded to dtype, as an all_reduce returns it), added to the residual in
    dtype, then RMSNorm in float32 (torch.nn.functional.rms_norm) times the weight; and the magnitude of the
    two terms of the residual's sum (a rounding of either moves the result by units of its own size)."""
    parts = [_data(seed, r, tokens, hidden, dtype) for r in range(world)]
    reduced = sum(p.float() for p, _, _ in parts).to(dtype)
    residual = parts[0][1] + reduced
    weight = parts[0][2]
    out = torch.nn.functional.rms_norm(residual.float(), (hidden,), eps=eps) * weight.float()
    return residual, out, parts[0][1].float().abs() + reduced.float().abs()


def _run(tokens, hidden, dtype, seeds, eps=1e-6, keep_out=False):
    """Per seed: (residual after the call, output), this rank's; the same heap partial and out for every seed
    when ``keep_out`` (the replayed path)."""
    ctx = iris.iris(1 << 24)
    rank = ctx.get_rank()
    device = ctx.get_device()
    partial = ctx.empty(tokens, hidden, dtype=dtype)
    out = torch.empty(tokens, hidden, dtype=dtype, device=device) if keep_out else None
    results = []
    for seed in seeds:
        p, residual, weight = (t.to(device) for t in _data(seed, rank, tokens, hidden, dtype))
        ctx.barrier()  # the previous call's readers are done (async_op=False ends with a barrier anyway)
        partial.copy_(p)
        got = ctx.ccl.all_reduce_rmsnorm(partial, residual, weight, eps=eps, out=out)
        results.append((residual.clone().cpu(), got.clone().cpu()))  # out is reused: a copy per seed
    ctx.close()
    return results


def _check(per_rank, tokens, hidden, dtype, seeds, eps=1e-6):
    for seed_index, seed in enumerate(seeds):
        want_residual, want_out, scale = _reference(seed, len(per_rank), tokens, hidden, dtype, eps)
        for rank, results in enumerate(per_rank):
            residual, out = results[seed_index]
            off = (residual.float() - want_residual.float()).abs()
            assert (off <= 2 * ULP[dtype] * scale).all(), f"rank {rank}, seed {seed}: the residual, off by {off.max()}"
            error = ((out.double() - want_out.double()).norm() / want_out.double().norm()).item()
            assert error <= TOLERANCE[dtype], f"rank {rank}, seed {seed}: relative error {error}"
        assert all(torch.equal(results[seed_index][1], per_rank[0][seed_index][1]) for results in per_rank), \
            "ranks differ"


def test_all_reduce_rmsnorm_matches_torch(ranks):
    """5 tokens of a hidden size that is not a power of two (masked columns), bf16."""
    seeds = [1, 2]
    _check(ranks.run(_run, 5, 100, torch.bfloat16, seeds), 5, 100, torch.bfloat16, seeds)


@pytest.mark.slow
@pytest.mark.parametrize("dtype,tokens,hidden", [(torch.float32, 1, 64), (torch.float16, 3, 256),
                                                 (torch.bfloat16, 70, 48)])
def test_all_reduce_rmsnorm_matches_torch_for_every_dtype_and_shape(ranks, dtype, tokens, hidden):
    """Every dtype, and 1 token (decode), 3, and 70 (more rows than the interpreter's programs), repeated into the
    same output (the replayed launch); each dtype with one shape, each shape with one dtype (CI's hour)."""
    seeds = [3, 4, 5]
    _check(ranks.run(_run, tokens, hidden, dtype, seeds, keep_out=True), tokens, hidden, dtype, seeds)


def _run_fp8(tokens, hidden, seed):
    """One call into an fp8 e4m3 out with per-token scales, twice into the same out (the second replayed)."""
    ctx = iris.iris(1 << 24)
    device = ctx.get_device()
    partial = ctx.empty(tokens, hidden, dtype=torch.bfloat16)
    out = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn, device=device)
    scale = torch.empty(tokens, dtype=torch.float32, device=device)
    results = []
    for _ in range(2):
        p, residual, weight = (t.to(device) for t in _data(seed, ctx.get_rank(), tokens, hidden, torch.bfloat16))
        ctx.barrier()
        partial.copy_(p)
        ctx.ccl.all_reduce_rmsnorm(partial, residual, weight, out=out, out_scale=scale)
        results.append((out.float().clone().cpu(), scale.clone().cpu()))
    ctx.close()
    return results


def test_all_reduce_rmsnorm_into_fp8_with_a_scale_per_token(ranks):
    """out * scale is the normalised row within e4m3's precision (3 mantissa bits: 1/16 relative when rounded to
    nearest; the interpreters of Triton 3.6 round some conversions toward zero, up to 1/8), and each row's
    largest magnitude is the format's largest value, 448."""
    tokens, hidden, seed = 3, 100, 7
    _, want, _ = _reference(seed, ranks.world_size, tokens, hidden, torch.bfloat16, 1e-6)
    for rank, results in enumerate(ranks.run(_run_fp8, tokens, hidden, seed)):
        for q, scale in results:
            assert torch.allclose(scale, want.abs().amax(dim=1) / 448, rtol=2e-2), (rank, scale)
            assert (q.abs().amax(dim=1) == 448).all(), (rank, q.abs().amax(dim=1))
            error = ((q * scale[:, None] - want).norm() / want.norm()).item()
            assert error <= 0.08, f"rank {rank}: relative error {error}"


def _refusals():
    ctx = iris.iris(1 << 20)
    device = ctx.get_device()
    partial = ctx.zeros(4, 8)
    residual, weight = torch.zeros(4, 8, device=device), torch.ones(8, device=device)
    calls = {
        "off the heap": lambda: ctx.ccl.all_reduce_rmsnorm(torch.zeros(4, 8, device=device), residual, weight),
        "weight": lambda: ctx.ccl.all_reduce_rmsnorm(partial, residual, torch.ones(7, device=device)),
        "residual": lambda: ctx.ccl.all_reduce_rmsnorm(partial, torch.zeros(4, 9, device=device), weight),
        "dtype": lambda: ctx.ccl.all_reduce_rmsnorm(ctx.zeros(4, 8, dtype=torch.int32), residual, weight),
        "fp8 without scale": lambda: ctx.ccl.all_reduce_rmsnorm(
            partial, residual, weight, out=torch.empty(4, 8, dtype=torch.float8_e4m3fn, device=device)),
    }
    messages = {}
    for name, call in calls.items():
        try:
            call()
            messages[name] = None
        except (TypeError, ValueError) as exc:
            messages[name] = str(exc)
    # a device whose kernels store no float8 (an NVIDIA sm_80, an AMD gfx90a): its backend says so
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(ctx.backend), "float8_formats", lambda self, device: ())
        try:
            ctx.ccl.all_reduce_rmsnorm(partial, residual, weight,
                                       out=torch.empty(4, 8, dtype=torch.float8_e4m3fn, device=device),
                                       out_scale=torch.empty(4, device=device))
            messages["no fp8 here"] = None
        except ValueError as exc:
            messages["no fp8 here"] = str(exc)
    ctx.close()
    return messages


def test_bad_arguments_are_refused_before_any_launch(ranks):
    for messages in ranks.run(_refusals):
        assert "symmetric heap" in messages["off the heap"], messages
        assert "weight must have shape (8,)" in messages["weight"], messages
        assert "residual has shape (4, 9)" in messages["residual"], messages
        assert "dtype int32" in messages["dtype"], messages
        assert "an fp8 out takes out_scale" in messages["fp8 without scale"], messages
        assert "cannot store on this device" in messages["no fp8 here"] and "Use a 16-bit out" in \
            messages["no fp8 here"], messages
