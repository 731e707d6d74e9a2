"""benchmarks/gemm.py runs end to end (on the CPU backend: a smoke test, never a timing assertion)."""

from benchmark_runs import run_benchmark


def test_gemm_benchmark_validates_and_writes_a_row_per_implementation(tmp_path):
    rows = run_benchmark("gemm.py", 1, "--m", "16", "--nk", "32x48", "--samples", "1", "--validate",
                         csv_path=tmp_path / "gemm.csv")
    methods = list(dict.fromkeys(r["method"] for r in rows))
    assert methods in (["eager"], ["graph", "device"])  # the interpreter's smoke run; a GPU's two methods
    assert [(int(r["M"]), int(r["N"]), int(r["K"]), r["impl"], r["method"]) for r in rows] == [
        (16, 32, 48, impl, method) for method in methods for impl in ("cublas", "iris", "iris_tuned")]
    assert all(float(r["us"]) > 0 for r in rows)
