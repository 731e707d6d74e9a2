"""Options, hypothesis profiles and the session's ranks for the conformance suite.

    python -m pytest conformance --ranks 4 --hypothesis-profile thorough

Profiles: ``smoke`` (derandomized, one or two examples: the default test tier),
``ci`` (derandomized, few examples: the CPU backend in CI's slow stage), ``dev``
(random, more examples) and ``thorough`` (many examples and long litmus runs:
GPUs). ``--hypothesis-profile`` wins over IRIS_CONFORMANCE_PROFILE; the
default is ``smoke``.
"""

import os

import pytest
from hypothesis import HealthCheck, settings

from conformance import harness
from conformance.profiles import DEFAULT, PROFILES
from iris.testing import RankPool

for _name, _profile in PROFILES.items():
    settings.register_profile(
        _name, max_examples=_profile.max_examples, derandomize=_profile.derandomize, deadline=None,
        database=None, print_blob=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                               HealthCheck.data_too_large])


def pytest_addoption(parser):
    parser.addoption("--ranks", type=int, default=2, help="rank processes in the session's world (default 2)")
    parser.addoption("--heap-size", type=int, default=0,
                     help="bytes of heap per rank (default: the 1 MiB the cases use); e.g. 68719476736 for the "
                          "original's 64 GiB, reserved by the vmem heap and backed as the cases use it")


def pytest_configure(config):
    chosen = config.getoption("hypothesis_profile", None) or os.environ.get("IRIS_CONFORMANCE_PROFILE", DEFAULT)
    if chosen not in PROFILES:
        raise pytest.UsageError(f"hypothesis profile {chosen!r} is not one of {', '.join(PROFILES)}")
    settings.load_profile(chosen)
    os.environ["IRIS_CONFORMANCE_PROFILE"] = chosen  # the rank processes size their litmus runs from it
    heap_size = config.getoption("heap_size")
    if heap_size:
        os.environ["IRIS_CONFORMANCE_HEAP_SIZE"] = str(heap_size)  # read by the rank processes' contexts
    ranks = config.getoption("ranks")
    if ranks < 1:
        raise pytest.UsageError(f"--ranks {ranks}: need at least one rank")


def pytest_report_header(config):
    return (f"iris conformance: {config.getoption('ranks')} ranks, profile {os.environ['IRIS_CONFORMANCE_PROFILE']}, "
            f"heap {os.environ.get('IRIS_CONFORMANCE_HEAP_SIZE', 'default')} bytes per rank, "
            f"backend {os.environ.get('IRIS_BACKEND', 'automatic')}, "
            f"simulation {os.environ.get('IRIS_SIMULATION', 'off')}")


@pytest.fixture(scope="session")
def _pool(request):
    pool = RankPool(request.config.getoption("ranks"))
    yield harness.World(pool, os.environ["IRIS_CONFORMANCE_PROFILE"])
    pool.close()


@pytest.fixture
def world(_pool, request):
    """The session's ranks (one persistent pool), told which test is running for its reproduce line."""
    _pool.nodeid = request.node.nodeid
    return _pool
