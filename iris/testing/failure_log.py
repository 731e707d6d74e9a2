"""A pytest plugin: each failing test is appended to the file ``IRIS_FAILURE_LOG`` names, as it fails.

Why: a session killed before its summary (a time limit, a hung rank) names no failures. Load it with
``-p iris.testing.failure_log`` (the repository's conftest.py does).

Example:
    $ IRIS_FAILURE_LOG=failures.txt timeout 200 pytest tests -q -n 8
    $ cat failures.txt      # FAILED tests/test_ccl.py::test_all_reduce[2ranks-ll] (call)
"""

from __future__ import annotations

from iris import config as iris_config

_path: str | None = None


def pytest_configure(config):
    global _path
    # xdist workers report to the controller, which logs for them.
    _path = None if hasattr(config, "workerinput") else iris_config.failure_log() or None


def pytest_runtest_logreport(report):
    if _path is not None and report.failed:
        with open(_path, "a") as log:
            log.write(f"FAILED {report.nodeid} ({report.when})\n")
