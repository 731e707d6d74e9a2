"""A pytest plugin: each failing test is appended to the file ``IRIS_FAILURE_LOG`` names, as it fails, and
``<that file>.running`` always names the tests started and not yet finished.

Why: a session killed before its summary (a time limit, a hung rank) names no failures, and a test that hangs
never fails. Load it with ``-p iris.testing.failure_log`` (the repository's conftest.py does).

Example:
    $ IRIS_FAILURE_LOG=failures.txt timeout 200 pytest tests -q -n 8
    $ cat failures.txt      # FAILED tests/test_ccl.py::test_all_reduce[2ranks-ll] (call)
    $ cat failures.txt.running   # tests/test_gemm.py::test_matmul_matches_float64[...]: had started, not finished
"""

from __future__ import annotations

import os

from iris import config as iris_config

_path: str | None = None


def pytest_configure(config):
    global _path
    # xdist workers report to the controller, which logs for them.
    _path = None if hasattr(config, "workerinput") else iris_config.failure_log() or None


_running: dict[str, None] = {}  # the tests started and not finished, in the order they started


def pytest_runtest_logreport(report):
    if _path is not None and report.failed:
        with open(_path, "a") as log:
            log.write(f"FAILED {report.nodeid} ({report.when})\n")


def pytest_runtest_logstart(nodeid, location):
    if _path is not None:
        _running[nodeid] = None
        _write_running()


def pytest_runtest_logfinish(nodeid, location):
    if _path is not None:
        _running.pop(nodeid, None)
        _write_running()


def _write_running() -> None:
    """``<log>.running``, replaced whole (written beside it, then renamed): a kill at any moment leaves either the
    previous list or the new one."""
    partial = f"{_path}.running.partial"
    with open(partial, "w") as out:
        out.write("".join(f"{nodeid}\n" for nodeid in _running))
    os.replace(partial, f"{_path}.running")
