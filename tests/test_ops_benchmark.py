"""benchmarks/ops.py runs every fused op end to end and validates it (CPU: a smoke test, not a figure).

Three ranks: matmul_all_reduce's partials grow with the world size, and the heap is sized from the
sweep with no slack, so a term missing from that sum runs out of heap here.
"""

import csv
import shlex

import pytest
import torch

import iris
from benchmark_runs import import_benchmark, run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)

OPS = {"matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "matmul_all_gather", "gemm_all_scatter"}


def test_ops_benchmark_validates_every_op_and_shape_at_three_ranks(tmp_path):
    rows = run_benchmark("ops.py", 3, "--validate", "--m", "48", "--n", "48", "96", "--k", "96",
                         csv_path=tmp_path / "ops.csv")
    assert {(r["op"], int(r["N"])) for r in rows} == {(op, n) for op in OPS for n in (48, 96)}
    assert all(r["world_size"] == "3" and float(r["fused_us"]) > 0 for r in rows)


def test_ops_benchmark_takes_config_switches_and_tracing(tmp_path):
    shape = ["--validate", "--ops", "matmul_all_reduce", "--m", "32", "--n", "64", "--k", "64", "--trace"]
    (row,) = run_benchmark("ops.py", 2, *shape, "--config", "tma_loads=1,reduce_at_owner=0,num_stages=2",
                           csv_path=tmp_path / "ops.csv")
    assert row["trace"] == "1" and "tma_loads=True" in row["config"] and "reduce_at_owner=False" in row["config"]
    assert "num_stages=2" in row["config"]
    bad = run_benchmark("ops.py", 2, *shape, "--config", "tma_loads=yes", check=False)
    assert bad.returncode != 0 and "tma_loads='yes'" in bad.stdout + bad.stderr


def test_ops_benchmark_pads_the_heap_and_the_device_memory_before_the_sweep(tmp_path):
    """--heap-pad-mib / --device-pad-mib: every workspace sits past a heap pad, or the process holds more device
    memory, for the whole run (to tell whether a fused op slows with the heap offset or the footprint); the heap is
    sized with the pad (sized with no slack, a missing term runs out of heap) and the CSV records both."""
    (row,) = run_benchmark("ops.py", 2, "--validate", "--ops", "all_gather_matmul", "--m", "32", "--n", "64", "--k",
                           "64", "--heap-pad-mib", "3", "--device-pad-mib", "2", csv_path=tmp_path / "ops.csv")
    assert (row["heap_pad_mib"], row["device_pad_mib"]) == ("3", "2")
    (plain,) = run_benchmark("ops.py", 2, "--ops", "all_gather_matmul", "--m", "32", "--n", "64", "--k", "64",
                             csv_path=tmp_path / "plain.csv")
    assert (plain["heap_pad_mib"], plain["device_pad_mib"]) == ("0", "0")


def test_ops_benchmark_profile_says_where_each_fused_ops_time_went(tmp_path):
    """--profile N: N traced calls per problem after the timed ones; the median of their per-program
    breakdowns in the CSV. all_gather_matmul by Iris's kernel (vendor_gemm=0): by the vendor's GEMM, its
    default here, only the waits for the slices are traced (the test below)."""
    rows = run_benchmark("ops.py", 2, "--profile", "2", "--ops", "matmul_all_reduce", "all_gather_matmul", "--m",
                         "32", "--n", "64", "--k", "64", "--config", "vendor_gemm=0", csv_path=tmp_path / "ops.csv")
    for row in rows:
        assert row["trace"] == "0" and int(row["profile_programs"]) >= 1 and row["profile_calls"] == "2", row
        assert float(row["profile_compute_us"]) > 0 and float(row["profile_compute_per_tile_us"]) > 0, row
        assert float(row["profile_span_us"]) >= float(row["profile_tail_us"]) >= 0, row
        assert float(row["profile_call_us"]) > 0, row  # the traced calls' own time
    pushes = {row["op"]: float(row["profile_put_us"]) for row in rows}
    assert pushes["matmul_all_reduce"] > 0 and pushes["all_gather_matmul"] == 0  # it waits for its slices


@pytest.mark.skipif(torch.cuda.is_available() and (torch.cuda.device_count() < 2 or iris.config.simulation()),
                    reason="the vendor's GEMM takes A's slices by copies, which need one GPU per rank; here 2 ranks "
                           "share a GPU")
def test_a_profile_of_all_gather_matmul_by_the_vendor_gemm_gives_its_waits_for_the_slices(tmp_path):
    """torch's GEMM records no span: the profile has no compute, one program (the arrival kernel's) and its
    waits for the other member's slice, and says so."""
    result = run_benchmark("ops.py", 2, "--profile", "1", "--ops", "all_gather_matmul", "--m", "32", "--n", "64",
                           "--k", "64", "--config", "vendor_gemm=1", csv_path=tmp_path / "ops.csv", check=False)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "traced: no tile's compute: the GEMM ran outside a fused kernel" in result.stdout
    assert "us per program (1 programs)" in result.stdout
    # the options it suggests run as typed (the line ends with them)
    hint = result.stdout.split("traced: no tile's compute", 1)[1].splitlines()[0]
    suggested = shlex.split("--config " + hint.split("--config ", 1)[1].split(" profiles")[0])
    rerun = run_benchmark("ops.py", 2, "--profile", "1", "--ops", "all_gather_matmul", "--m", "32", "--n", "64",
                          "--k", "64", *suggested, csv_path=tmp_path / "kernel.csv", check=False)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert "traced: no tile's compute" not in rerun.stdout
    with open(tmp_path / "ops.csv") as f:
        (row,) = csv.DictReader(f)
    assert row["profile_programs"] == "1" and float(row["profile_compute_us"]) == 0, row
    assert float(row["profile_wait_us"]) > 0, row


def test_a_profile_is_the_median_over_calls_of_the_mean_over_ranks():
    """One traced call's breakdown moves with the ranks' launch skew (2 x H100: the barrier column of
    one op 8.5 to 138 us at neighbouring sizes); the profile is the median over calls of the per-call
    mean over ranks, so one skewed call does not make the figure."""
    profile_columns = import_benchmark("ops").profile_columns

    def summary(span, barrier, compute, tiles, programs=4):
        return {"span_us": span, "idle_us": 1.0, "tail_us": 2.0, "programs": programs,
                "kinds": {"barrier": {"count": programs, "mean_us": barrier, "per_program_us": barrier},
                          "compute": {"count": tiles, "mean_us": compute * programs / tiles,
                                      "per_program_us": compute}}}

    calls = [[summary(100, 10, 60, 8), summary(120, 30, 60, 8)],   # call 1: ranks' mean barrier 20, span 110
             [summary(300, 200, 62, 8), summary(280, 180, 62, 8)],  # call 2: a skewed launch, barrier 190
             [summary(104, 14, 58, 8), summary(106, 16, 58, 8)]]    # call 3: barrier 15, span 105
    columns = profile_columns(calls)
    assert columns["profile_calls"] == 3 and columns["profile_programs"] == 4
    assert columns["profile_barrier_us"] == 20.0 and columns["profile_span_us"] == 110.0
    assert columns["profile_compute_us"] == 60.0 and columns["profile_put_us"] == 0.0
    assert columns["profile_compute_per_tile_us"] == 30.0  # 8 tiles over 4 programs of 60 us: 30 us a tile


def _profiled_row(**figures):
    row = {"op": "matmul_all_reduce", "M": "1024", "N": "8192", "fused_us": "160", "cublas_us": "95",
           "iris gemm_us": "105", "nccl_us": "64", "iris.ccl_us": "70", "overlap_efficiency": "0.59375",
           "profile_span_us": "150", "profile_compute_us": "92", "profile_put_us": "30", "profile_reduce_us": "8",
           "profile_wait_us": "4", "profile_barrier_us": "2", "profile_idle_us": "10", "profile_call_us": "170"}
    return {**row, **{key: str(value) for key, value in figures.items()}}


def test_breakdown_says_where_a_fused_call_spends_its_time_beyond_the_gemm_alone():
    """T_fused = the faster GEMM alone + compute beyond it + put + reduce + wait + barrier + idle + the traced
    call's time outside the kernel's span + tracing (the untraced call's time less the traced one's) + the rest
    (spans that overlap: per-kind means against the span)."""
    breakdown = import_benchmark("ops").breakdown
    terms = breakdown(_profiled_row())
    assert terms == {"gemm": 95.0, "compute": -3.0, "put + reduce": 38.0, "wait + barrier": 6.0, "idle": 10.0,
                     "outside": 20.0, "tracing": -10.0, "rest": 4.0}
    assert breakdown(_profiled_row(cublas_us=120))["gemm"] == 105.0  # the faster of cuBLAS and iris's GEMM
    assert sum(terms.values()) == 160.0
    # a run before the traced calls were timed: outside against the untimed call, tracing's cost within it
    old = breakdown({key: value for key, value in _profiled_row().items() if key != "profile_call_us"})
    assert old["outside"] == 10.0 and old["tracing"] == 0.0 and sum(old.values()) == 160.0


def test_ops_benchmark_prints_the_breakdown_of_a_csv_without_running(tmp_path):
    """--breakdown CSV: a Markdown table of a profiled run's rows, below the overlap it is given, no ranks."""
    import csv
    import subprocess
    import sys

    from benchmark_runs import ROOT

    path = tmp_path / "ops.csv"
    rows = [_profiled_row(), _profiled_row(op="all_gather_matmul", overlap_efficiency="0.95")]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ops.py"), "--breakdown", str(path),
                           "--below", "0.9"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("|")]
    assert len(lines) == 3, proc.stdout  # header, rule, one row: the 0.95 one is not below 0.9
    assert lines[2].split("|")[1:4] == [" matmul_all_reduce ", " 1024 ", " 8192 "], lines[2]
    assert "| 0.59 | 160.0 | 95.0 | 64.0 | -3.0 | 38.0 | 6.0 | 10.0 | 20.0 | -10.0 | 4.0 |" in lines[2], lines[2]


def _gpu_event(name, ts, dur, stream, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"stream": stream, "device": 0}}


def test_a_timeline_is_the_gpus_activities_after_the_lead_spin_with_its_busy_time():
    """--timeline reads torch.profiler's Chrome trace: the call's kernels and copies are those after the last
    lead spin (the barrier and the spin before it are not the call's); the span runs from the first start to
    the last end, the busy time is the union of the activities (overlaps once, gaps not)."""
    timeline = import_benchmark("_timeline")
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 500.0, "tid": 1},
              _gpu_event("device_barrier_kernel", 100.0, 5.0, 7),
              _gpu_event("at::cuda::(anonymous namespace)::spin_kernel(long)", 105.0, 300.0, 7),
              _gpu_event("nvjet_tst_gemm", 405.0, 30.0, 7),
              _gpu_event("Memcpy PtoP (Device -> Device)", 410.0, 10.0, 21, cat="gpu_memcpy"),
              _gpu_event("wait_for_slice", 440.0, 2.0, 7),
              _gpu_event("nvjet_tst_gemm", 442.0, 28.0, 7)]
    acts = timeline.activities(events)
    assert [(name[:6], stream, start, length) for name, stream, start, length in acts] == [
        ("nvjet_", 7, 0.0, 30.0), ("Memcpy", 21, 5.0, 10.0), ("wait_f", 7, 35.0, 2.0), ("nvjet_", 7, 37.0, 28.0)]
    assert timeline.span_us(acts) == 65.0
    assert timeline.busy_us(acts) == 60.0  # 0-30 (the copy inside it), a gap of 5, 35-65
    assert timeline.activities(events[:1]) == [] and timeline.span_us([]) == 0.0  # no GPU activity: none
    assert len(timeline.activities(events[:2])) == 1  # no lead spin: every GPU activity
    assert timeline.describe(acts[:1]) == ["+     0.0     30.0  stream 7   nvjet_tst_gemm"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal given where there is no GPU")
def test_the_timeline_needs_a_gpu_and_says_so_before_any_rank_starts(tmp_path):
    result = run_benchmark("ops.py", 2, "--timeline", "--ops", "all_gather_matmul", "--m", "32", "--n", "64",
                           "--k", "64", csv_path=tmp_path / "ops.csv", check=False)
    assert result.returncode != 0 and "--timeline needs a GPU" in result.stdout + result.stderr
