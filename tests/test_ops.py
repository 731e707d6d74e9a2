"""ctx.ops.matmul_all_reduce against a float64 reference: each rank's K-shard product, summed over ranks."""

import pytest
import torch

import iris
from iris.ops import FusedConfig
from iris.testing import refusals

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _shards(seed, rank, m, n, k, dtype):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(m, k, generator=g).to(dtype), torch.randn(k, n, generator=g).to(dtype)


def _matmul_all_reduce(m, n, k, out_dtype, with_bias, seeds):
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    errors = []
    for seed in seeds:  # the same output shape again: the kept workspace, new flags counts
        a, b = _shards(seed, rank, m, n, k, torch.bfloat16)
        bias = torch.randn(n, generator=torch.Generator().manual_seed(seed)) if with_bias else None
        out = torch.full((m, n), float("nan"), dtype=out_dtype, device=device)  # poison
        ctx.ops.matmul_all_reduce(out, a.to(device), b.to(device), bias=None if bias is None else bias.to(device))
        ref = sum(x.double() @ y.double() for x, y in (_shards(seed, r, m, n, k, torch.bfloat16)
                                                      for r in range(world)))
        if bias is not None:
            ref = ref + bias.double()
        got = out.cpu().double()
        errors.append(float("inf") if got.isnan().any() else ((got - ref).norm() / ref.norm()).item())
    ctx.close()
    return errors


@pytest.mark.parametrize("shape", [(40, 70, 24), (64, 32, 50)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_matmul_all_reduce_matches_float64(ranks, shape, out_dtype):
    for rank, errors in enumerate(ranks.run(_matmul_all_reduce, *shape, out_dtype, out_dtype == torch.float32,
                                            seeds=[1, 2])):
        assert max(errors) <= TOLERANCE[out_dtype], f"rank {rank}: relative errors {errors}"


def _refusals():
    ctx = iris.iris(1 << 20)
    device = ctx.get_device()
    a = torch.zeros(8, 4, dtype=torch.bfloat16, device=device)
    b = torch.zeros(4, 16, dtype=torch.bfloat16, device=device)
    out = torch.zeros(8, 16, device=device)
    messages = refusals([lambda: ctx.ops.matmul_all_reduce(out, a, b[:3]),
                         lambda: ctx.ops.matmul_all_reduce(out, a.float(), b.float()),
                         lambda: ctx.ops.matmul_all_reduce(out, a, b, bias=torch.zeros(5, device=device))])
    ctx.close()
    return messages


def test_matmul_all_reduce_refuses_bad_operands_before_any_launch(ranks):
    for messages in ranks.run(_refusals):
        assert "inner sizes differ" in messages[0]
        assert "has dtype torch.float32; supported: bfloat16, float16" in messages[1]
        assert "bias must be 1-D of length 16" in messages[2]


@pytest.mark.parametrize("field,value", [("block_size_m", 8), ("block_size_n", 100), ("group_size_m", 3),
                                         ("num_warps", 0), ("num_stages", True)])
def test_fused_config_names_the_bad_field_and_value(field, value):
    with pytest.raises(ValueError) as info:
        FusedConfig(**{field: value})
    assert f"FusedConfig.{field}={value!r}" in str(info.value)
