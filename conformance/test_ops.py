"""GEMM + communication (iris.ops): matmul_all_reduce is the float64 sum of every rank's shard product.

Each case draws M, N, K (any sizes: tiles and programs need not divide them), the output dtype,
a bias or none, and the data. Every rank knows every rank's shards (seeded), so each checks its
whole output against the float64 reference (relative error within the output dtype's rounding)
and sends it back: all ranks must hold the same bits. The workspace lies in the arena, over
random bytes, with its flags zeroed, as a fresh one would be.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import harness
from conformance.profiles import current
from iris.ops import FusedConfig
from iris.ops.gemm import tile_count
from iris.ops.matmul_all_reduce import Workspace, _tile

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _shards(case, rank: int):
    g = harness.generator(case["seed"], rank, 21)
    a = torch.randn(case["m"], case["k"], generator=g).to(torch.bfloat16)
    b = torch.randn(case["k"], case["n"], generator=g).to(torch.bfloat16)
    return a, b


def _matmul_all_reduce_on_rank(case):
    ctx = harness.context()
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    harness.fill_arena(case["seed"])
    m, n, dtype = case["m"], case["n"], case["out_dtype"]
    tile = _tile(FusedConfig())
    partials = harness.region(0, world * m * n, torch.float32)
    flags = harness.region(world * m * n * 4 // 256 * 256 + 256, tile_count(m, n, tile), torch.int64)
    flags.zero_()
    workspace = Workspace(partials, flags, tile)
    a, b = _shards(case, rank)
    bias = torch.randn(n, generator=harness.generator(case["seed"], 0, 22)) if case["bias"] else None
    out = torch.full((m, n), float("nan"), dtype=dtype, device=device)  # poison: every element written
    violations = harness.attempt(ctx.ops.matmul_all_reduce, out, a.to(device), b.to(device),
                                 bias=None if bias is None else bias.to(device), workspace=workspace)
    ref = sum(x.double() @ y.double() for x, y in (_shards(case, r) for r in range(world)))
    if bias is not None:
        ref = ref + bias.double()
    got = out.cpu()
    if got.isnan().any():
        violations.append(f"{int(got.isnan().sum())} of {m * n} output elements never written")
    else:
        error = ((got.double() - ref).norm() / max(ref.norm().item(), 1e-30)).item()
        if error > TOLERANCE[dtype]:
            violations.append(f"relative error {error:.3g} against the float64 reference (allowed "
                              f"{TOLERANCE[dtype]:g})")
    return harness.Verdict(violations, value=got)


@st.composite
def matmul_all_reduce_cases(draw):
    return dict(m=draw(st.integers(1, 48)), n=draw(st.integers(1, 48)), k=draw(st.integers(1, 40)),
                out_dtype=draw(st.sampled_from((torch.float32, torch.bfloat16))), bias=draw(st.booleans()),
                seed=draw(harness.seeds()))


@settings(max_examples=current().examples(2))
@given(data=st.data())
def test_matmul_all_reduce_matches_the_float64_reference(world, data):
    """Every rank gets the float64 sum of all ranks' A @ B (+ bias), within rounding, and the same bits."""
    outputs = world.check(_matmul_all_reduce_on_rank, data.draw(matmul_all_reduce_cases(), label="case"))
    for rank, out in enumerate(outputs[1:], start=1):
        assert torch.equal(out.view(torch.uint8), outputs[0].view(torch.uint8)), f"rank {rank}'s bits differ"
