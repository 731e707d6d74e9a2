"""benchmarks/latency.py runs end to end (on the CPU backend: a smoke test, never a timing assertion)."""

import pytest

from benchmark_runs import run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)


def test_latency_benchmark_writes_every_row(tmp_path):
    rows = run_benchmark("latency.py", 2, "--iters", "3", "--replays", "1", csv_path=tmp_path / "latency.csv")
    assert [(r["measure"], r["impl"], r["pair"]) for r in rows] == [
        ("one_way_flag", "iris", "0-1"), ("barrier", "iris.device_barrier", "all"),
        ("barrier", "torch_symm_mem", "all")]
    assert float(rows[0]["us"]) > 0 and float(rows[1]["us"]) > 0
    assert rows[2]["us"] or rows[2]["note"]  # measured, or the reason it could not be
