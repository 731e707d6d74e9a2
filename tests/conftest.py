import pytest

from iris.testing import RankPool


@pytest.fixture(scope="session", params=[2, 4], ids=lambda n: f"{n}ranks")
def ranks(request):
    """A persistent pool of rank processes, one per world size (2 and 4)."""
    pool = RankPool(request.param)
    yield pool
    pool.close()
