"""benchmarks/tp_decode.py runs end to end (on the CPU backend: a smoke test, never a timing assertion)."""

import pytest

from benchmark_runs import run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)


def test_tp_decode_benchmark_validates_and_writes_every_row(tmp_path):
    """Each way of the example's compiled step per batch; a way's communication share is its time minus the step
    without an all-reduce ("local")."""
    rows = run_benchmark("tp_decode.py", 2, "--hidden", "32", "--batch", "3", "--ways", "iris", "local",
                         "--iters", "1", "--validate", csv_path=tmp_path / "tp_decode.csv")
    # (torch.distributed's way runs in example 18's test; symmetric memory needs GPUs)
    assert [(int(r["batch"]), r["impl"]) for r in rows] == [(3, "iris"), (3, "local")]
    for row in rows:
        assert float(row["us"]) > 0 and row["method"] == "eager"
        assert (row["comm_us"] == "") == (row["impl"] == "local")
