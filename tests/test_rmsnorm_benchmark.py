"""benchmarks/rmsnorm.py runs end to end (on the CPU backend: a smoke test, never a timing assertion)."""

import pytest

from benchmark_runs import run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)


def test_rmsnorm_benchmark_validates_and_writes_every_row(tmp_path):
    rows = run_benchmark("rmsnorm.py", 2, "--tokens", "1", "3", "--hidden", "48", "--iters", "1", "--validate",
                         csv_path=tmp_path / "rmsnorm.csv")
    assert [(int(r["tokens"]), r["impl"]) for r in rows] == [
        (tokens, impl) for tokens in (1, 3) for impl in ("iris.fused", "iris+torch", "nccl+torch")]
    assert all(float(r["us"]) > 0 for r in rows)
    assert {r["method"] for r in rows} == {"eager"}  # the CPU backend's only method (benchmarks/_timing.py)


def test_the_compiled_ways_validate_and_are_timed_beside_the_others(tmp_path):
    """--compiled: the residual add and rms_norm in one torch.compile'd function after each all-reduce."""
    rows = run_benchmark("rmsnorm.py", 2, "--tokens", "2", "--hidden", "48", "--iters", "1", "--validate",
                         "--compiled", csv_path=tmp_path / "rmsnorm.csv")
    assert [r["impl"] for r in rows] == ["iris.fused", "iris+torch", "nccl+torch", "iris+compiled", "nccl+compiled"]
    assert all(float(r["us"]) > 0 for r in rows)
