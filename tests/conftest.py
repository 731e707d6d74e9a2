import pytest

from iris import config
from iris.testing import RankPool

#: the world the default tier runs at; every other world size (and the 3-rank pool) is the slow tier's
FAST_WORLD = 2


def _world(n: int):
    return pytest.param(n, id=f"{n}ranks", marks=() if n == FAST_WORLD else pytest.mark.slow)


@pytest.fixture(scope="session", params=[_world(n) for n in config.test_worlds()])
def ranks(request):
    """A persistent pool of rank processes, one per world size (IRIS_TEST_WORLDS, 2 unless set: 2,4 repeats every
    pooled test at 4 ranks, a slow-tier run for a machine with a core per rank or a GPU in simulation, not
    for CI's two cores, where conformance at 4 ranks and the 3-rank pool cover other worlds); the default
    tier runs at 2 ranks only."""
    pool = RankPool(request.param)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def three_ranks():
    """A pool of 3 ranks for a test file: a world neither 2 nor a power of two (tiles' owners wrap unevenly).
    Its tests are the slow tier's (see pytest_collection_modifyitems)."""
    pool = RankPool(3)
    yield pool
    pool.close()


def pytest_collection_modifyitems(items):
    for item in items:
        if "three_ranks" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
