"""The capability table answers per backend, feature, dtype and concurrency, with a reason."""

import torch

from iris.capabilities import LIMITATIONS, limitation


def test_cpu_gaps_have_reasons_and_gpus_have_none():
    assert "bfloat16" in limitation("cpu", "atomic", torch.bfloat16)
    assert limitation("cpu", "atomic", "float16") is None  # a single writer is exact
    assert "not atomic across processes" in limitation("cpu", "atomic", torch.float16, concurrent=True)
    assert limitation("cpu", "atomic", torch.int32, concurrent=True) is None
    for backend in ("cuda", "hip"):
        assert limitation(backend, "atomic", torch.bfloat16, concurrent=True) is None


def test_every_row_explains_itself():
    for row in LIMITATIONS:
        assert row.backend in ("cpu", "cuda", "hip") and len(row.reason) > 20
