"""A pytest plugin: each failing test is appended to the file ``IRIS_FAILURE_LOG`` names, as it fails.

pytest names its failures in the summary at the end of a session. A session stopped before its end
(a time limit on a GPU machine, a hung rank) prints none of it, and with ``-q`` its progress line shows
only an ``F``. With ``IRIS_FAILURE_LOG=path``, each failure is written to that file at once, one line
each: ``FAILED <node id> (<setup|call|teardown>)``. Under pytest-xdist the controller writes it, once per
failure. Unset, nothing is written. The repository's conftest.py loads it (``.ci/gpu.sh`` sets the
variable); another suite can with ``-p iris.testing.failure_log``.

Example:
    $ IRIS_FAILURE_LOG=failures.txt timeout 200 pytest tests -q -n 8
    $ cat failures.txt      # FAILED tests/test_ccl.py::test_all_reduce[2ranks-ll] (call)
"""

from __future__ import annotations

from iris import config as iris_config

_path: str | None = None


def pytest_configure(config):
    global _path
    # pytest-xdist's workers report to the controller, which runs this hook for their reports too.
    _path = None if hasattr(config, "workerinput") else iris_config.failure_log() or None


def pytest_runtest_logreport(report):
    if _path is not None and report.failed:
        with open(_path, "a") as log:
            log.write(f"FAILED {report.nodeid} ({report.when})\n")
