"""benchmarks/moe.py and benchmarks/all_to_all_v.py run end to end (on the CPU backend: smoke tests, never a
timing assertion)."""

import pytest

from benchmark_runs import run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)


def test_moe_benchmark_validates_and_writes_every_row(tmp_path):
    rows = run_benchmark("moe.py", 2, "--tokens", "3", "--hidden", "16", "--experts", "4", "--topk", "2", "--iters",
                         "1", "--validate", csv_path=tmp_path / "moe.csv")
    assert [r["impl"] for r in rows] == ["iris.dispatch", "torch.nccl.dispatch", "iris.combine", "torch.nccl.combine",
                                         "iris.round_trip", "torch.nccl.round_trip", "iris.dispatch.fp8",
                                         "iris.round_trip.fp8"]
    assert all(float(r["us"]) > 0 for r in rows)


def test_all_to_all_v_benchmark_validates_and_writes_every_row(tmp_path):
    rows = run_benchmark("all_to_all_v.py", 2, "--sizes", "64K", "--iters", "1", "--validate",
                         csv_path=tmp_path / "all_to_all_v.csv")
    assert [(int(r["bytes"]), r["impl"]) for r in rows] == [(1 << 16, "iris.device_counts"), (1 << 16, "nccl.splits")]
    assert all(float(r["us"]) > 0 for r in rows)
