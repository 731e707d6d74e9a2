"""iris.inference.AllReduce: the inference engines' contract (registered buffer, should_use, out-of-place
all_reduce, the hand-off to torch.distributed above its size) against torch.distributed's own all_reduce."""

import pytest
import torch
import torch.distributed as dist

import iris


def _calls(nccl_above):
    """Per call: (went through Iris, result equals torch.distributed's sum bit for bit or within rounding,
    input left as it was)."""
    ctx = iris.iris(1 << 24)
    comm = iris.inference.AllReduce(max_bytes=1 << 16, ctx=ctx, nccl_above=nccl_above)
    rank, device = ctx.get_rank(), ctx.get_device()
    found = []
    for seed, (shape, dtype) in enumerate([((7,), torch.float32), ((16, 64), torch.bfloat16),
                                           ((4, 1024), torch.float16), ((8, 1024), torch.float32),
                                           ((16, 64), torch.bfloat16)]):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed * 10 + rank)).to(dtype).to(device)
        before = x.clone()
        used = comm.should_use(x)
        got = comm.all_reduce(x)
        want = x.float().clone()
        dist.all_reduce(want)
        tolerance = 0 if dtype == torch.float32 else 1e-2
        close = torch.allclose(got.float(), want, rtol=tolerance, atol=tolerance * want.abs().max().item())
        found.append((used, close and got.dtype == dtype and got.shape == x.shape, torch.equal(x, before)))
    refused = [comm.should_use(t) for t in (torch.ones(8, 8, device=device).t(), torch.ones(4, dtype=torch.int64),
                                            torch.ones(0, device=device))]
    comm.close()
    ctx.close()
    return found, refused


def test_small_tensors_go_through_iris_and_large_ones_to_torch_distributed(ranks):
    for rank, (found, refused) in enumerate(ranks.run(_calls, 1 << 14)):
        # 28 B, 2 KiB, 8 KiB: Iris; 32 KiB: above nccl_above (16 KiB), torch.distributed; 2 KiB again: Iris
        assert [used for used, _, _ in found] == [True, True, True, False, True], (rank, found)
        assert all(ok and unchanged for _, ok, unchanged in found), (rank, found)
        assert refused == [False, False, False], (rank, refused)  # not contiguous, int64, empty


def test_max_bytes_must_be_positive():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_bytes"):
            iris.inference.AllReduce(max_bytes=bad, ctx=object())
