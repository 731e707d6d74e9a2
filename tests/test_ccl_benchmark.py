"""benchmarks/ccl.py runs end to end and validates iris against torch.distributed (CPU: a smoke test)."""

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark_runs import run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)

ROOT = Path(__file__).resolve().parents[1]


def test_ccl_benchmark_validates_and_writes_every_row(tmp_path):
    rows = run_benchmark("ccl.py", 2, "--max", "2K", "--iters", "1", "--warmup", "0", "--calls", "2", "--validate",
                         "--dtypes", "bf16", "fp8e4m3", "--host", "--trace",  # host time: GPU only, absent here
                         "--nccl-symmetric", csv_path=tmp_path / "ccl.csv")
    seen = {(r["collective"], r["dtype"], r["impl"]) for r in rows}
    for collective in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert (collective, "bf16", "iris") in seen and (collective, "bf16", "nccl") in seen, seen
    assert ("all_gather", "fp8e4m3", "iris") in seen and ("all_reduce", "fp8e4m3", "iris") not in seen
    assert {"iris.one_shot", "iris.two_shot"} <= {r["impl"] for r in rows if r["collective"] == "all_reduce"}
    for collective in ("all_gather", "all_to_all"):  # the copy engine's variant beside the default
        assert "iris.copies" in {r["impl"] for r in rows if r["collective"] == collective}, collective
    assert all(float(r["us"]) > 0 for r in rows if r["us"])
    assert {r["trace"] for r in rows} == {"1"}  # validated with every collective recording its events
    assert {r["calls_per_sample"] for r in rows} == {"2"} and {r["samples"] for r in rows} == {"1"}
    assert all(r["nccl_proto"] and r["nccl_algo"] for r in rows)  # NCCL's version, protocol and algorithm
    symmetric = [r for r in rows if r["impl"] == "nccl.symmetric"]  # NCCL's registered window: timed, or why not
    assert {r["collective"] for r in symmetric} == {"all_reduce"} and all(r["us"] or r["note"] for r in symmetric)
    methods = {r["method"] for r in rows}
    if all(r["backend"] == "cpu" for r in rows):
        assert all(r["us"] == "" and "need CUDA" in r["note"] for r in symmetric), symmetric
        assert methods == {"eager"}
    else:  # the GPU gate: every implementation by every method, replayed from a graph or the row says why
        assert methods == {"device", "eager", "graph", "host"}
        impls = {r["impl"] for r in rows if r["method"] == "host"}
        assert {"iris (host)", "iris (host, slowest rank)", "null (host)", "null bound (host)"} <= impls
        for host, slowest in zip((r for r in rows if r["impl"] == "iris (host)"),
                                 (r for r in rows if r["impl"] == "iris (host, slowest rank)")):
            assert float(slowest["us"]) >= float(host["us"]) > 0
        for method in ("device", "eager", "graph"):
            assert {(r["collective"], r["dtype"], r["impl"]) for r in rows if r["method"] == method} == \
                {(r["collective"], r["dtype"], r["impl"]) for r in rows if r["method"] == "device"}
        assert all(r["us"] or r["note"] for r in rows)
        assert all(r["suspect"] in ("0", "1") for r in rows if r["method"] == "device")


def test_the_cpu_backend_refuses_the_methods_it_cannot_take(tmp_path):
    """The CPU backend has no CUDA events or graphs: asking for them is an error before any timing."""
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ccl.py"), "--methods", "device"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "IRIS_BACKEND": "cpu"})
    assert proc.returncode == 2 and "only eager runs there" in proc.stderr, proc.stderr


def _tune(tmp_path, *csvs, margin=None, env=None):
    table = tmp_path / "tuned.py"
    command = [sys.executable, str(ROOT / "benchmarks" / "ccl.py"), "--tune-from", *map(str, csvs), "--tune-file",
               str(table)] + ([] if margin is None else ["--tune-margin", str(margin)])
    environment = {**os.environ, "IRIS_LL_PACK": "0", **(env or {})}  # ll one element a word, unless asked
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    namespace = {}
    exec(table.read_text(), namespace)
    return namespace["ALL_REDUCE"], table.read_text()


PAIR = ("iris.one_shot", "iris.two_shot")
TUNED = ("iris.one_shot", "iris.two_shot", "iris.push", "iris.ll")


def _run_csv(path, world, times, trace=None, impls=PAIR, ll_pack=None):
    """A ccl.py CSV of all_reduce rows: {bytes: (us of each of ``impls``, None for no row)}; ``trace`` and
    ``ll_pack``: those columns' values (None: no column, as in the runs committed before it existed)."""
    extra = {name: value for name, value in (("trace", trace), ("ll_pack", ll_pack)) if value is not None}
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["world_size", "commit", "collective", "dtype", "bytes", "impl", "us",
                                               *extra])
        writer.writeheader()
        for nbytes, figures in times.items():
            for impl, us in zip(impls, figures):
                if us is not None:
                    writer.writerow(dict(world_size=world, commit="abc1234", collective="all_reduce", dtype="bf16",
                                         bytes=nbytes, impl=impl, us=us, **extra))
    return path


def test_a_traced_run_is_not_tuned_from(tmp_path):
    plain = _run_csv(tmp_path / "a.csv", 2, {1024: (5, 10), 4096: (10, 5)}, trace="0")
    traced = _run_csv(tmp_path / "b.csv", 2, {1024: (50, 10), 4096: (1, 5)}, trace="1")
    assert _tune(tmp_path, plain, traced)[0] == _tune(tmp_path, plain)[0] == {(2, "bf16"): ((4096, "one_shot"),)}


def test_tuning_takes_the_median_over_runs_and_a_margin(tmp_path):
    first = _run_csv(tmp_path / "a.csv", 2, {1024: (5, 10), 2048: (5, 10), 4096: (10, 5), 8192: (9.8, 10)})
    second = _run_csv(tmp_path / "b.csv", 2, {1024: (6, 10), 2048: (20, 10), 4096: (10, 5), 8192: (9.8, 10)})
    third = _run_csv(tmp_path / "c.csv", 2, {1024: (7, 10), 2048: (6, 10), 4096: (10, 5), 8192: (9.8, 10)})
    table, text = _tune(tmp_path, first, second, third)
    # 1-2 KiB: one_shot's medians (6 and 6 against 10); 8 KiB: 2% ahead, inside the 5% margin
    assert table == {(2, "bf16"): ((4096, "one_shot"),)}
    assert "abc1234" in text and "a.csv" in text  # where the table came from
    table, _ = _tune(tmp_path, first, second, third, margin=0.01)
    assert table == {(2, "bf16"): ((4096, "one_shot"), (8192, "two_shot"), (1 << 62, "one_shot"))}


def test_the_committed_table_is_what_the_committed_runs_give(tmp_path):
    """The runs the table names (its docstring's list: any GPU's, e.g. one kind's 2-rank run beside
    another's 4- and 8-rank runs through --tune-from) give that table again. Each is a canonical run in
    benchmarks/results/ or, where a later run replaced it there, kept in benchmarks/tuning/."""
    from iris.ccl.all_reduce import tuned

    names = re.findall(r"^    (ccl_\S+\.csv) \(commit", tuned.__doc__, re.MULTILINE)
    folders = (ROOT / "benchmarks" / "results", ROOT / "benchmarks" / "tuning")
    runs = [next((folder / name for folder in folders if (folder / name).exists()), folders[0] / name)
            for name in names]
    assert runs and all(run.exists() for run in runs), names
    table, _ = _tune(tmp_path, *runs, env={"IRIS_LL_PACK": ""})  # unset, as the table was tuned
    assert table == tuned.ALL_REDUCE


def test_tuning_takes_push_or_ll_where_fastest_and_runs_without_them(tmp_path):
    """push and ll compete where a run measured them; runs without their rows (the older CSVs) tune as before."""
    path = _run_csv(tmp_path / "push.csv", 2, {1024: (8, 10, 5, 6), 2048: (8, 10, 5, 4), 4096: (8, 10, 9.5, 9.6),
                                               65536: (12, 10, 11, 12)}, impls=TUNED)
    table, _ = _tune(tmp_path, path)
    assert table == {(2, "bf16"): ((2048, "push"), (4096, "ll"), (65536, "one_shot"))}


def test_ll_is_tuned_from_the_runs_whose_ll_packed_as_the_tuner_does(tmp_path):
    """ll with IRIS_LL_PACK=1 (two 16-bit elements a word) is another protocol than ll without: a run's ll rows
    count only where its ll_pack column matches the tuner's setting (no column: unpacked)."""
    unpacked = _run_csv(tmp_path / "a.csv", 2, {1024: (8, 10, 9, 5), 262144: (20, 10, 8.5, 30)}, impls=TUNED)
    packed = _run_csv(tmp_path / "b.csv", 2, {1024: (8, 10, 9, 5), 262144: (20, 10, 8.5, 6)}, impls=TUNED, ll_pack="1")
    assert _tune(tmp_path, unpacked, packed)[0] == {(2, "bf16"): ((262144, "ll"), (1 << 62, "push"))}
    assert _tune(tmp_path, unpacked, packed, env={"IRIS_LL_PACK": "1"})[0] == {(2, "bf16"): ((1 << 62, "ll"),)}
    # unset: packed past 32768 elements only, so the unpacked run's ll counts at 1 KiB, the packed one's at 256 KiB
    auto = _run_csv(tmp_path / "c.csv", 2, {1024: (8, 10, 9, 50), 262144: (20, 10, 8.5, 50)}, impls=TUNED,
                    ll_pack="auto")  # a run that packed as the default does: its ll counts at both sizes
    assert _tune(tmp_path, unpacked, packed, env={"IRIS_LL_PACK": ""})[0] == {(2, "bf16"): ((1 << 62, "ll"),)}
    assert _tune(tmp_path, unpacked, packed, auto, env={"IRIS_LL_PACK": ""})[0] == {
        (2, "bf16"): ((262144, "one_shot"), (1 << 62, "push"))}  # ll's medians now 27.5 and 28: slower than both


def test_tuning_takes_graph_replay_rows_where_a_run_has_them(tmp_path):
    """A repeated call replays from a CUDA graph (IRIS_GRAPH_REPLAY, on by default), and eager figures of
    small calls are the host's time, whichever variant runs: where a run timed two_shot and another
    variant replayed from a graph, those rows decide; elsewhere the eager rows do, as before."""
    replayed = tuple(f"{impl}+graph" for impl in TUNED)
    path = _run_csv(tmp_path / "graph.csv", 2, {
        1024: (8, 10, 12, 13, 6, 6, 5.5, 3),  # replayed: ll
        2048: (8, 10, 12, 13, 6, 5, 5.5, 5),  # replayed: two_shot
        4096: (12, 10, 8, 13, None, None, None, 1),  # no two_shot replayed: eager, push
        8192: (12, 10, 8, 13)}, impls=TUNED + replayed)
    table, text = _tune(tmp_path, path)
    assert table == {(2, "bf16"): ((2048, "ll"), (4096, "two_shot"), (1 << 62, "push"))}
    assert "graph" in text  # the table says what its figures were


def test_tuning_reads_the_method_column(tmp_path):
    """Runs with the method column: graph rows decide where two_shot and another variant have them, else the
    device rows; eager and host rows never."""
    path = tmp_path / "m.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["world_size", "commit", "collective", "dtype", "bytes", "impl", "method",
                                               "us"])
        writer.writeheader()
        for nbytes, method, one_shot, two_shot in ((1024, "graph", 3, 5), (1024, "device", 9, 5),
                                                   (1024, "eager", 9, 5), (4096, "device", 9, 5),
                                                   (4096, "eager", 2, 5), (4096, "host", 1, 5)):
            for impl, us in (("iris.one_shot", one_shot), ("iris.two_shot", two_shot)):
                writer.writerow(dict(world_size=2, commit="abc1234", collective="all_reduce", dtype="bf16",
                                     bytes=nbytes, impl=impl, method=method, us=us))
    assert _tune(tmp_path, path)[0] == {(2, "bf16"): ((4096, "one_shot"),)}
