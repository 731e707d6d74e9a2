"""benchmarks/rma.py --pairs all measures and validates every ordered pair of ranks (CPU: a smoke test)."""

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_rma_benchmark_covers_every_ordered_pair(tmp_path):
    out = tmp_path / "rma.csv"
    command = [sys.executable, "-m", "iris", "run", "-n", "3", "--timeout", "300", str(ROOT / "benchmarks" / "rma.py"),
               "--sizes", "64K", "--iters", "1", "--warmup", "0", "--validate", "--pairs", "all", "--csv", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "VALIDATION FAILED" not in proc.stdout
    rows = list(csv.DictReader(open(out)))
    pairs = {(int(r["actor"]), int(r["peer"])) for r in rows}
    assert pairs == {(a, b) for a in range(3) for b in range(3) if a != b}, pairs
    assert {r["op"] for r in rows} == {"copy_engine_local", "put", "get", "load", "store"}
