"""benchmarks/ops.py runs every fused op end to end and validates it (CPU: a smoke test, not a figure).

Three ranks: matmul_all_reduce's partials grow with the world size, and the heap is sized from the
sweep with no slack, so a term missing from that sum runs out of heap here.
"""

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OPS = {"matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "matmul_all_gather", "gemm_all_scatter"}


def test_ops_benchmark_validates_every_op_and_shape_at_three_ranks(tmp_path):
    out = tmp_path / "ops.csv"
    command = [sys.executable, "-m", "iris", "run", "-n", "3", "--timeout", "300", str(ROOT / "benchmarks" / "ops.py"),
               "--validate", "--m", "48", "--n", "48", "96", "--k", "96", "--csv", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(open(out)))
    assert {(r["op"], int(r["N"])) for r in rows} == {(op, n) for op in OPS for n in (48, 96)}
    assert all(r["world_size"] == "3" and float(r["fused_us"]) > 0 for r in rows)


def test_ops_benchmark_takes_config_switches_and_tracing(tmp_path):
    out = tmp_path / "ops.csv"
    command = [sys.executable, "-m", "iris", "run", "-n", "2", "--timeout", "300", str(ROOT / "benchmarks" / "ops.py"),
               "--validate", "--ops", "matmul_all_reduce", "--m", "32", "--n", "64", "--k", "64", "--trace",
               "--config", "tma_loads=1,reduce_at_owner=0,num_stages=2", "--csv", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (row,) = csv.DictReader(open(out))
    assert row["trace"] == "1" and "tma_loads=True" in row["config"] and "reduce_at_owner=False" in row["config"]
    assert "num_stages=2" in row["config"]
    bad = subprocess.run(command[:-4] + ["--config", "tma_loads=yes"], capture_output=True, text=True, timeout=400)
    assert bad.returncode != 0 and "tma_loads='yes'" in bad.stdout + bad.stderr
