"""A pytest plugin: the cross-compile gate over a test session (``--cross-compile`` or IRIS_CROSS_COMPILE).

Every kernel the CPU backend launches is first compiled for the GPU targets; the test that launched one that
does not compile fails with the compiler's message, and the session ends with a count of what was compiled per
target. The repository's conftest.py loads it; elsewhere, ``-p iris.testing.cross_compile_plugin``.

Example:
    $ pytest tests --cross-compile cuda:90,hip:gfx942
    ...
    cross-compile cuda:90: 518 specializations of 64 kernels compiled
"""

from __future__ import annotations

import time

from iris.config import cross_compile_targets
from iris.testing.cross_compile import enable, summary


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
