"""Run one of benchmarks/*.py under ``iris run`` the way a user would, for the benchmarks' smoke tests."""

import csv
import importlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_benchmark(script: str, ranks: int, *args: str, csv_path: Path | None = None,
                  check: bool = True) -> subprocess.CompletedProcess | list[dict]:
    """``iris run -n ranks benchmarks/<script> args [--csv csv_path]``.

    With ``check`` (default): asserts it exited 0 without "VALIDATION FAILED" and returns the CSV's rows;
    without: returns the finished process, for a run that must fail.

    Example:
        >>> rows = run_benchmark("rma.py", 2, "--sizes", "64K", csv_path=tmp_path / "rma.csv")
    """
    command = [sys.executable, "-m", "iris", "run", "-n", str(ranks), "--timeout", "300",
               str(ROOT / "benchmarks" / script), *args] + (["--csv", str(csv_path)] if csv_path else [])
    proc = subprocess.run(command, capture_output=True, text=True, timeout=400)
    if not check:
        return proc
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "VALIDATION FAILED" not in proc.stdout
    with open(csv_path) as f:
        return list(csv.DictReader(f))


def import_benchmark(name: str):
    """benchmarks/<name>.py as a module (its own imports, such as _results, found beside it), for the
    tests of a benchmark's pure functions.

    Example:
        >>> profile_columns = import_benchmark("ops").profile_columns
    """
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
