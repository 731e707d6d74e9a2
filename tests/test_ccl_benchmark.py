"""benchmarks/ccl.py runs end to end and validates iris against torch.distributed (CPU: a smoke test)."""

import csv
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ccl_benchmark_validates_and_writes_every_row(tmp_path):
    out = tmp_path / "ccl.csv"
    command = [sys.executable, "-m", "iris", "run", "-n", "2", "--timeout", "300", str(ROOT / "benchmarks" / "ccl.py"),
               "--max", "2K", "--iters", "1", "--warmup", "0", "--validate", "--dtypes", "bf16", "fp8e4m3",
               "--graph", "--host", "--csv", str(out)]  # graph replay and host time: GPU only, absent here
    proc = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "VALIDATION FAILED" not in proc.stdout
    rows = list(csv.DictReader(open(out)))
    seen = {(r["collective"], r["dtype"], r["impl"]) for r in rows}
    for collective in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        assert (collective, "bf16", "iris") in seen and (collective, "bf16", "nccl") in seen, seen
    assert ("all_gather", "fp8e4m3", "iris") in seen and ("all_reduce", "fp8e4m3", "iris") not in seen
    assert {"iris.one_shot", "iris.two_shot"} <= {r["impl"] for r in rows if r["collective"] == "all_reduce"}
    assert all(float(r["us"]) > 0 for r in rows if r["us"])
    impls = {r["impl"] for r in rows}
    if any(r["backend"] != "cpu" for r in rows):  # the GPU gate: replayed from a graph, or the row says why
        assert {"iris+graph", "iris (host)", "null (host)", "null bound (host)"} <= impls, impls
        assert all(r["us"] or r["note"] for r in rows if r["impl"].endswith("+graph"))
    else:
        assert not any(impl.endswith(("+graph", "(host)")) for impl in impls)
