"""benchmarks/gemm.py runs end to end (on the CPU backend: a smoke test, never a timing assertion)."""

from benchmark_runs import run_benchmark


def test_gemm_benchmark_validates_and_writes_a_row_per_implementation(tmp_path):
    rows = run_benchmark("gemm.py", 1, "--m", "16", "--nk", "32x48", "--samples", "1", "--validate",
                         csv_path=tmp_path / "gemm.csv")
    assert [(int(r["M"]), int(r["N"]), int(r["K"]), r["impl"]) for r in rows] == [
        (16, 32, 48, impl) for impl in ("cublas", "iris", "iris_tuned")]
    assert all(float(r["us"]) > 0 for r in rows) and {r["method"] for r in rows} == {"eager"}
