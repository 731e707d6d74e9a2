"""benchmarks/results/ holds one canonical run per benchmark, GPU kind and world size, and a generated summary.

Each (benchmark, GPU kind, ranks) keeps its latest CSV and PNG, named ``<benchmark>_<gpu-kind>_<N>ranks``;
A/B arms, pilots and probe outputs go elsewhere (git history keeps the old ones). The summary,
benchmarks/results/README.md, is written by ``python benchmarks/summarize_results.py`` and must match it.
"""

import collections
import pytest

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
    assert path.parent == RESULTS and summary.parse_name(path.name) == ("ccl", "nvidia-h100", 4, ".csv")
    # the kind, not the memory: the name an H100 SXM reports and the name an H200 reports
    assert [summary.gpu_slug(name) for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA H100 NVL",
                                                  "AMD Instinct MI300X", "NVIDIA A100-SXM4-80GB")] == [
        "nvidia-h100", "nvidia-h200", "nvidia-h100-nvl", "amd-instinct-mi300x", "nvidia-a100-sxm4"]


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


# The benchmarks page's figures: one table per benchmark, drawn from the reference platform's canonical CSV
# (<benchmark>_nvidia-h200_2ranks.csv), so the numbers a user reads cannot drift from the data.

def _reference_rows(benchmark):
    import csv
    with open(RESULTS / f"{benchmark}_nvidia-h200_2ranks.csv", newline="") as f:
        return list(csv.DictReader(f))


def _cells(markdown):
    """The data rows of every Markdown table in ``markdown``, as lists of stripped cells."""
    rows = []
    for line in markdown.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _number(cell):
    return float(cell.split()[0].rstrip("×"))


def _close(cell, value):
    return abs(_number(cell) - value) <= 0.005 * value + 0.05


def _tables(markdown):
    """[(the line before a table, its header cells, its data rows)] of every Markdown table in ``markdown``."""
    found, title = [], None
    for block in markdown.split("\n\n"):
        if block.startswith("|"):
            header, *data = _cells(block)
            found.append((title, header, data))
        else:
            title = block.strip()
    return found


def test_the_ccl_figures_read_the_reference_csv_a_table_per_method():
    summary = import_benchmark("summarize_results")
    rows = _reference_rows("ccl")  # written before the method column: "+graph" names, "host" notes
    assert "method" not in rows[0]
    text = summary.ccl_figures(rows)
    tables = _tables(text)
    assert [title.split(" (")[0] for title, _, _ in tables] == ["Device time per call", "CUDA graph replay per call"]
    assert "nccl-tests' method" in tables[0][0]

    def figure(impl):
        return next(float(r["us"]) for r in rows if (r["collective"], r["bytes"], r["impl"]) ==
                    ("all_reduce", "1048576", impl) and r["note"] != "host")

    for (_, header, data), suffix in zip(tables, ("", "+graph")):
        assert header[:2] == ["collective", "size per rank"] and len(data) >= 4
        collectives = [c[0] for c in data]
        named = [next(n for n in reversed(collectives[:i + 1]) if n) for i in range(len(data))]  # blank: as above
        found = dict(zip(header, next(c for c, n in zip(data, named) if (n, c[1]) == ("all_reduce", "1 MiB"))))
        nccl, iris = figure("nccl" + suffix), figure("iris" + suffix)
        assert _close(found["NCCL (µs)"], nccl) and _close(found["Iris (µs)"], iris)
        assert _close(found["NCCL / Iris"], nccl / iris)
    assert "(host)" not in text and "+graph" not in text and "copy_in" not in text


def _ccl_row(impl, method, us, collective="all_reduce", nbytes=1024, note=""):
    return {"gpu": "NVIDIA H200", "world_size": "2", "commit": "abc1234", "calls_per_sample": "20",
            "collective": collective, "dtype": "bf16", "bytes": str(nbytes), "impl": impl, "method": method,
            "us": str(us), "note": note}


def test_the_ccl_figures_of_a_csv_with_a_method_column_compare_by_one_method():
    summary = import_benchmark("summarize_results")
    rows = [_ccl_row("iris", "graph", 3.0), _ccl_row("nccl", "graph", 9.0),
            _ccl_row("iris", "device", 5.0), _ccl_row("iris.ll", "device", 4.0), _ccl_row("nccl", "device", 10.0),
            _ccl_row("symm_mem.two_shot", "device", 8.0), _ccl_row("iris.copy_in", "device", 1.0),
            _ccl_row("iris", "eager", 12.0), _ccl_row("nccl", "eager", 60.0),
            _ccl_row("iris.ll", "eager", "", note="ll takes at most ..."),
            _ccl_row("iris (host)", "host", 7.0), _ccl_row("nccl", "device", 99.0, nbytes=3 << 30)]
    assert summary.ccl_method(rows[0]) == ("iris", "graph")
    assert summary.ccl_method({"impl": "iris.ll+graph", "note": ""}) == ("iris.ll", "graph")
    assert summary.ccl_method({"impl": "iris (host)", "note": "host"}) == ("iris (host)", "host")
    assert summary.ccl_method({"impl": "nccl", "note": ""}) == ("nccl", "device")
    tables = _tables(summary.ccl_figures(rows))
    assert [title for title, _, _ in tables] == [
        "Device time per call (CUDA events around 20 back-to-back calls, nccl-tests' method). "
        "Medians in µs; NCCL / Iris above 1: Iris is faster.",
        "Host-inclusive eager time per call (the wall clock around 20 back-to-back calls, the GPU waited for once "
        "at the end). Medians in µs; NCCL / Iris above 1: Iris is faster.",
        "CUDA graph replay per call (20 calls captured once, one replay between CUDA events). "
        "Medians in µs; NCCL / Iris above 1: Iris is faster."]
    cells = [dict(zip(header, data[0])) for _, header, data in tables]
    assert [len(data) for _, _, data in tables] == [1, 1, 1]  # 3 GiB is none of CCL_SIZES; host rows left out
    assert [c["NCCL / Iris"] for c in cells] == ["2.00×", "5.00×", "3.00×"]
    assert cells[0]["best Iris variant (µs)"] == "4.00 (ll)" and cells[0]["symm_mem best (µs)"] == "8.00 (two_shot)"
    assert cells[1]["best Iris variant (µs)"] == "–"  # ll has no figure at this size; copy_in is no variant


def test_a_side_by_side_csv_with_a_method_column_gets_a_table_per_method():
    summary = import_benchmark("summarize_results")
    rows = [{"tokens": "1", "hidden": "64", "impl": impl, "method": method, "us": str(us)}
            for impl, method, us in (("iris.fused", "graph", 2.0), ("iris+torch", "graph", 5.0),
                                     ("iris.fused", "device", 4.0), ("iris+torch", "device", 6.0))]
    tables = _tables(summary.rmsnorm_figures(rows))
    assert [title for title, _, _ in tables] == ["Device time per call (CUDA events around back-to-back calls):",
                                                 "CUDA graph replay per call:"]
    assert [data[0][-1] for _, _, data in tables] == ["1.50×", "2.50×"]
    assert summary.rmsnorm_figures([{k: v for k, v in r.items() if k != "method"} for r in rows[:2]]).startswith(
        "| tokens |")


def test_the_rma_figures_read_the_reference_csv():
    summary = import_benchmark("summarize_results")
    rows = _reference_rows("rma")
    header, *data = _cells(summary.rma_figures(rows))
    put = next(r for r in rows if r["op"] == "put" and r["bytes"] == str(256 << 20))
    cells = dict(zip(header, next(c for c in data if c[0] == "put")))
    assert _close(cells["256 MiB"], float(put["gbps"]))
    assert cells["256 MiB"].endswith(f"({float(put['ratio_to_copy_engine']):.2f}×)")


def test_the_latency_figures_read_the_reference_csv():
    summary = import_benchmark("summarize_results")
    rows = _reference_rows("latency")
    header, *data = _cells(summary.latency_figures(rows))
    assert len(data) == len(rows)
    flag = next(r for r in rows if r["measure"] == "one_way_flag")
    cells = dict(zip(header, next(c for c in data if c[0] == "one_way_flag")))
    assert _close(cells["µs"], float(flag["us"]))


def test_the_ops_figures_read_the_reference_csv():
    summary = import_benchmark("summarize_results")
    rows = _reference_rows("ops")
    header, *data = _cells(summary.ops_figures(rows))
    assert len(data) >= 5
    row = next(r for r in rows if (r["op"], r["M"], r["N"]) == ("matmul_all_reduce", "128", "8192"))
    cells = dict(zip(header, next(c for c in data if c[:2] == ["matmul_all_reduce", "128 × 8192 × 8192"])))
    assert _close(cells["fused (µs)"], float(row["fused_us"]))
    assert _close(cells["torch + NCCL (µs)"], float(row["torch+nccl_us"]))
    assert _close(cells["speedup"], float(row["speedup"]))


def test_the_figures_name_their_data_and_appear_in_the_summary():
    summary = import_benchmark("summarize_results")
    not_yet_run = {"gemm"}  # written, smoke-tested on the CPU, not yet run on the reference platform (one H100 only)
    for benchmark in not_yet_run:
        assert summary.figures(benchmark) is None, f"{benchmark} has run on the reference platform: drop it here"
    for benchmark in set(summary.BENCHMARKS) - not_yet_run:
        text = summary.figures(benchmark)
        assert text and f"[{benchmark}_nvidia-h200_2ranks.csv]" in text and "NVIDIA H200, 2 ranks" in text
        assert text in summary.readme(RESULTS)
    assert summary.figures("ccl", RESULTS.parent / "no-such-folder") is None


def test_the_docs_hook_draws_figures_and_warns_of_a_marker_matching_nothing(caplog):
    import importlib.util
    import types
    pytest.importorskip("mkdocs", reason="the docs hook runs inside mkdocs: pip install -e '.[docs]'")
    spec = importlib.util.spec_from_file_location("benchmark_results_hook",
                                                  ROOT / "docs" / "hooks" / "benchmark_results.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    page = types.SimpleNamespace(file=types.SimpleNamespace(src_uri="benchmarks.md"))
    out = hook.on_page_markdown("<!-- figures rma -->\n\n<!-- figures nothing -->\n", page, None, None)
    assert "| op |" in out and "(results/rma_nvidia-h200_2ranks.csv)" in out and "<!--" not in out
    assert any("nothing" in record.getMessage() for record in caplog.records)
