import pytest

from iris.testing import RankPool


@pytest.fixture(scope="session", params=[2, 4], ids=lambda n: f"{n}ranks")
def ranks(request):
    """A persistent pool of rank processes, one per world size (2 and 4)."""
    pool = RankPool(request.param)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def three_ranks():
    """A pool of 3 ranks for a test file: a world neither 2 nor a power of two (tiles' owners wrap unevenly)."""
    pool = RankPool(3)
    yield pool
    pool.close()
