import pytest

from iris import config
from iris.testing import RankPool


@pytest.fixture(scope="session", params=config.test_worlds(), ids=lambda n: f"{n}ranks")
def ranks(request):
    """A persistent pool of rank processes, one per world size (2 and 4, or IRIS_TEST_WORLDS)."""
    pool = RankPool(request.param)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def three_ranks():
    """A pool of 3 ranks for a test file: a world neither 2 nor a power of two (tiles' owners wrap unevenly)."""
    pool = RankPool(3)
    yield pool
    pool.close()
