"""iris.testing.failure_log: each failing test is named in IRIS_FAILURE_LOG as it fails, not only in the summary.

A GPU gate run under a time limit is killed before pytest's summary when a test hangs or the limit is
short; the log still says which tests had failed by then. Each case runs a real pytest session on a
small suite, with and without pytest-xdist's workers.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)

SUITE = '''
def test_passes():
    assert True

def test_fails():
    assert 1 == 2

def test_also_fails():
    raise RuntimeError("boom")
'''


def _run(tmp_path, *extra, log=True):
    (tmp_path / "test_inner.py").write_text(SUITE)
    env = dict(os.environ)
    env.pop("IRIS_FAILURE_LOG", None)
    if log:
        env["IRIS_FAILURE_LOG"] = str(tmp_path / "failures.txt")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                           "iris.testing.failure_log", "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py"),
                           *extra], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # two tests failed
    return proc


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_each_failing_test_is_named_once_in_the_log(tmp_path, workers):
    _run(tmp_path, *workers)
    lines = (tmp_path / "failures.txt").read_text().splitlines()
    assert sorted(lines) == ["FAILED test_inner.py::test_also_fails (call)", "FAILED test_inner.py::test_fails (call)"]


def test_no_log_is_written_without_the_variable(tmp_path):
    _run(tmp_path, log=False)
    assert not (tmp_path / "failures.txt").exists()


HANGING = '''
import time

def test_passes():
    assert True

def test_hangs():
    time.sleep(600)
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one process", "xdist"])
def test_a_session_stopped_mid_test_leaves_the_running_test_named(tmp_path, workers):
    """A gate stopped by its time limit while a test hangs: ``<IRIS_FAILURE_LOG>.running`` names the tests that
    had started and not finished, so the hang is found without a summary."""
    (tmp_path / "test_inner.py").write_text(HANGING)
    env = {**os.environ, "IRIS_FAILURE_LOG": str(tmp_path / "failures.txt")}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                             "iris.testing.failure_log", "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py"),
                             *workers], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path, env=env,
                            start_new_session=True)
    running = tmp_path / "failures.txt.running"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and "test_hangs" not in (running.read_text() if running.exists() else ""):
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # as a time limit's kill would: no summary, no hook after this
        proc.wait()
    assert running.read_text().splitlines() == ["test_inner.py::test_hangs"]
