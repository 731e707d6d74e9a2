"""benchmarks/results/ holds one canonical run per benchmark, GPU kind and world size, and a generated summary.

Each (benchmark, GPU kind, ranks) keeps its latest CSV and PNG, named ``<benchmark>_<gpu-kind>_<N>ranks``;
A/B arms, pilots and probe outputs go elsewhere (git history keeps the old ones). The summary,
benchmarks/results/README.md, is written by ``python benchmarks/summarize_results.py`` and must match it.
"""

import collections

from benchmark_runs import ROOT, import_benchmark

RESULTS = ROOT / "benchmarks" / "results"


def test_results_hold_one_canonically_named_csv_and_png_per_benchmark_gpu_and_world_size():
    summary = import_benchmark("summarize_results")
    files = sorted(p.name for p in RESULTS.iterdir() if p.name != "README.md")
    stray = [name for name in files if summary.parse_name(name) is None]
    assert not stray, (f"benchmarks/results/ keeps only <benchmark>_<gpu-kind>_<N>ranks.csv/.png "
                       f"(benchmarks: {', '.join(summary.BENCHMARKS)}); move these out: {stray}")
    per_key = collections.Counter(summary.parse_name(name) for name in files)
    assert all(count == 1 for count in per_key.values()), per_key
    assert any(name.endswith(".csv") for name in files)


def test_every_benchmark_named_is_a_script_that_writes_canonical_names():
    summary = import_benchmark("summarize_results")
    for benchmark in summary.BENCHMARKS:
        assert (ROOT / "benchmarks" / f"{benchmark}.py").exists(), benchmark
    path = import_benchmark("_results").default_csv("ccl", "NVIDIA H100 80GB HBM3", 4)
    assert path.parent == RESULTS and summary.parse_name(path.name) == ("ccl", "nvidia-h100-80gb-hbm3", 4, ".csv")


def test_the_committed_summary_is_what_the_command_writes_now():
    summary = import_benchmark("summarize_results")
    committed = (RESULTS / "README.md").read_text() if (RESULTS / "README.md").exists() else ""
    assert committed == summary.readme(RESULTS), \
        "benchmarks/results/README.md is stale: run python benchmarks/summarize_results.py"


def test_the_summary_names_each_runs_gpu_ranks_commits_and_figure(tmp_path):
    summary = import_benchmark("summarize_results")
    (tmp_path / "rma_nvidia-h200_2ranks.csv").write_text("gpu,backend,world_size,version,commit,op\n"
                                                         "NVIDIA H200,cuda,2,0.1,abc1234,put\n"
                                                         "NVIDIA H200,cuda,2,0.1,def5678,get\n")
    (tmp_path / "rma_nvidia-h200_2ranks.png").write_bytes(b"")
    (tmp_path / "latency_nvidia-h100_4ranks.csv").write_text(
        "gpu,backend,world_size,version,commit,measure\nNVIDIA H100,cuda,4,0.1,1234567,x\n")
    rows = summary.table_rows(tmp_path)
    assert [(r.benchmark, r.gpu, r.ranks, r.commits) for r in rows] == [
        ("latency", "NVIDIA H100", 4, ("1234567",)), ("rma", "NVIDIA H200", 2, ("abc1234", "def5678"))]
    table = summary.table(rows, link=lambda name: f"results/{name}")
    assert "[rma_nvidia-h200_2ranks.png](results/rma_nvidia-h200_2ranks.png)" in table
    assert "[latency_nvidia-h100_4ranks.csv](results/latency_nvidia-h100_4ranks.csv)" in table
    assert summary.table(summary.table_rows(tmp_path, benchmark="rma"), link=str).count("\n") == 2  # header + 1 row
