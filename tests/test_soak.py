"""benchmarks/soak.py runs end to end: random collectives over every group of 3 ranks, each result checked
(on the CPU backend: a smoke test of the soak itself)."""

import pytest

from benchmark_runs import run_benchmark

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)


def test_soak_checks_every_call_and_reports_none_wrong_and_no_hang():
    proc = run_benchmark("soak.py", 3, "--calls", "24", "--progress", "12", "--kinds", "3", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "soak: 12 of 24 calls" in out and "soak: 24 calls, 0 wrong results, 0 hangs (3 ranks" in out, out
    kinds = [line for line in out.splitlines() if "soak time: " in line]  # where the time went, most first
    assert len(kinds) == 3 and all(" calls, " in line and "slowest" in line for line in kinds), out
    seconds = [float(line.split(" calls, ")[1].split(" s,")[0]) for line in kinds]
    assert seconds == sorted(seconds, reverse=True), kinds


def test_the_watchdog_names_the_call_that_outlasts_the_limit():
    # every call takes longer than a millisecond on the CPU backend: the first one is named as a hang
    proc = run_benchmark("soak.py", 2, "--calls", "4", "--timeout", "0.001", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "HANG: call 0: " in out and "did not finish in" in out, out
