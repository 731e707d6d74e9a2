"""Options shared by the test and conformance suites.

``--cross-compile cuda:90,hip:gfx942`` (default: IRIS_CROSS_COMPILE) compiles every kernel the CPU
backend launches for those GPU targets before running it (iris.testing.cross_compile); the
session ends with a count of what was compiled per target. Under ``IRIS_HEAP``, a test whose job that
heap provider refuses is skipped with the refusal (iris.testing.heap_refusals). With ``IRIS_FAILURE_LOG``,
each failing test is named in that file as it fails (iris.testing.failure_log).
"""

import time

from iris.config import cross_compile_targets
from iris.testing.cross_compile import enable, summary

pytest_plugins = ("iris.testing.heap_refusals", "iris.testing.failure_log")


def pytest_addoption(parser):
    parser.addoption("--cross-compile", default=cross_compile_targets(), metavar="TARGETS",
                     help="compile every kernel launched on the CPU backend for these GPU targets first, e.g. "
                          "cuda:90,hip:gfx942 (default: $IRIS_CROSS_COMPILE)")


def pytest_configure(config):
    config._iris_started = time.time()
    spec = config.getoption("cross_compile")
    config._iris_gate = enable(spec) if spec else None


def pytest_terminal_summary(terminalreporter, config):
    if getattr(config, "_iris_gate", None) is not None:
        for line in summary(since=config._iris_started):
            terminalreporter.write_line(f"cross-compile {line}")
