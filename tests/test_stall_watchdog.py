"""IRIS_STALL_TIMEOUT: a rank that stops calling collectives makes its peers end, naming what they waited for.

Real ranks under ``iris run`` (CPU backend): one rank sleeps while the others call all_reduce; each waiting
rank's device wait gives up after the bound, its watchdog prints the wait (the peer that never arrived) and its
last Iris call and ends the rank with exit code 75; the launcher then ends the job with that code. Without the
variable the waits stay unbounded (the default), which the slow tier's launcher tests cover with --timeout.
"""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from iris.host.watchdog import EXIT_CODE
from iris.runtime import SELECTED
from iris.runtime.host_page import FIXED_ADDRESS

_STALLING = """
    import os, time
    import torch
    import iris

    ctx = iris.iris(1 << 20)
    x = ctx.ones(64)
    ctx.ccl.all_reduce(x, x)  # every rank: the plans and kernels are made
    ctx.barrier()
    if ctx.get_rank() == {stalled}:
        time.sleep(600)  # stops calling collectives
    for _ in range(3):
        ctx.ccl.all_reduce(x, x)
    torch.cuda.synchronize()  # on a GPU the calls only queue: the host waits here for the one that gives up
    time.sleep(30)  # the program goes on (the watchdog polls once a second)
    print("never here", flush=True)
"""


def _stall(tmp_path, ranks: int, stalled: int, bound_s: int, **env_vars):
    script = tmp_path / "stall.py"
    script.write_text(textwrap.dedent(_STALLING.format(stalled=stalled)))
    env = dict(os.environ, IRIS_STALL_TIMEOUT=str(bound_s), **env_vars)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "iris", "run", "-n", str(ranks), "--timeout", "170", str(script)],
                          capture_output=True, text=True, timeout=200, env=env)
    return proc, time.monotonic() - started


def _check(proc, elapsed, ranks, stalled, bound_s):
    output = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_CODE, output[-3000:]
    assert "never here" not in output
    waiting = [r for r in range(ranks) if r != stalled]
    reports = [r for r in waiting if f"rank {r} stalled:" in output]
    assert reports, output[-3000:]  # the first to give up ends the job
    line = next(line for line in output.splitlines() if "stalled:" in line)
    assert f"gave up after {bound_s}" in line and "its last Iris call: all_reduce" in line, line
    # every rank's last call from the node's boards: the stalled one is behind (one all_reduce, then it slept)
    assert f"rank {stalled} all_reduce (call 1," in line, line
    assert all(f"rank {r} all_reduce (call 1," not in line for r in waiting), line
    assert elapsed < 150, elapsed


def test_a_stalled_rank_makes_its_peer_end_naming_it_and_the_call(tmp_path):
    proc, elapsed = _stall(tmp_path, 2, 1, 3)
    _check(proc, elapsed, 2, 1, 3)


@pytest.mark.skipif(SELECTED == "cpu", reason="the CPU backend's record is host memory already")
def test_with_the_record_on_a_host_page_the_watchdog_reads_it_without_a_gpu_call(tmp_path):
    proc, elapsed = _stall(tmp_path, 2, 1, 3, IRIS_RECORD_ON_HOST="1")
    _check(proc, elapsed, 2, 1, 3)


_RECORD_ADDRESS = """
    import iris
    from iris.device import rma

    ctx = iris.iris(1 << 20)
    print("record at", hex(rma.RECORD_ADDRESS.value), flush=True)
    ctx.close()
"""


@pytest.mark.skipif(SELECTED == "cpu", reason="kernels compile (and are cached) on GPUs only")
def test_with_the_record_on_a_host_page_kernels_compile_the_same_address_in_every_process(tmp_path):
    """The record's address is compiled into every kernel of a process with bounded waits: one address in every
    process keeps Triton's cache hitting from run to run."""
    script = tmp_path / "address.py"
    script.write_text(textwrap.dedent(_RECORD_ADDRESS))
    env = dict(os.environ, IRIS_STALL_TIMEOUT="30", IRIS_RECORD_ON_HOST="1")
    seen = set()
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        seen |= {line for line in proc.stdout.splitlines() if line.startswith("record at")}
    assert seen == {f"record at {hex(FIXED_ADDRESS)}"}, seen


def test_the_fixed_page_is_at_one_address_in_every_process():
    code = "from iris.runtime.host_page import fixed_page; a, w = fixed_page(); w[3] = 7; print(hex(a), w[0], w[3])"
    outputs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                              check=True).stdout.strip() for _ in range(2)}
    assert outputs == {f"{hex(FIXED_ADDRESS)} 0 7"}, outputs


@pytest.mark.slow
def test_a_stalled_rank_of_four_makes_the_job_end_naming_it(tmp_path):
    proc, elapsed = _stall(tmp_path, 4, 2, 3)
    _check(proc, elapsed, 4, 2, 3)


def test_the_stall_timeout_is_read_as_seconds_and_refuses_nonsense(monkeypatch):
    from iris import config

    monkeypatch.setenv("IRIS_STALL_TIMEOUT", "2.5")
    assert config.stall_timeout_s() == 2.5
    monkeypatch.setenv("IRIS_STALL_TIMEOUT", "-1")
    with pytest.raises(ValueError, match="0 .unbounded. or positive"):
        config.stall_timeout_s()
    monkeypatch.setenv("IRIS_STALL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="must be a number of seconds"):
        config.stall_timeout_s()
    monkeypatch.setenv("IRIS_STALL_TIMEOUT", "0")
    assert config.stall_timeout_s() == 0  # unbounded, on request
    monkeypatch.delenv("IRIS_STALL_TIMEOUT")
    assert config.stall_timeout_s() == 600  # on by default: a stalled peer ends the job within ten minutes
