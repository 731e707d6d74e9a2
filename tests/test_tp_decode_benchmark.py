"""benchmarks/tp_decode.py runs end to end (on the CPU backend: a smoke test, never a timing assertion)."""

import pytest

from benchmark_runs import run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)


def test_tp_decode_benchmark_validates_and_writes_every_row(tmp_path):
    """Each way of the example's compiled step per batch; a way's communication share is its time minus the step
    without an all-reduce ("local")."""
    rows = run_benchmark("tp_decode.py", 2, "--hidden", "32", "--batch", "1", "3", "--iters", "1", "--validate",
                         csv_path=tmp_path / "tp_decode.csv")
    assert [(int(r["batch"]), r["impl"]) for r in rows] == [
        (batch, way) for batch in (1, 3) for way in ("iris", "nccl", "local")]  # no symmetric memory on the CPU
    for row in rows:
        assert float(row["us"]) > 0
        assert (row["comm_us"] == "") == (row["impl"] == "local")
