"""A pytest plugin: under ``IRIS_HEAP``, a test whose job that heap provider refuses is skipped, with the refusal.

``IRIS_HEAP=shmem pytest tests`` asks every test's context for the shmem heap, and some jobs it cannot serve
by design: a test made in one process without torch.distributed, ranks sharing a GPU without CUDA MPS, any
job on the CPU backend. Each such context raises :class:`iris.HeapProviderRefusal` on every rank before any
allocation; this plugin reports the test as skipped with that refusal as the reason, wherever it was raised
(in the test's process, on the rank pool's processes, under ``iris run``: the failure's text names the
exception). Any other failure stays one, and so does a refusal while ``IRIS_HEAP`` is unset (a test that
asks for a provider itself and is refused has failed). The repository's conftest.py loads it; another
project's suite can with ``-p iris.testing.heap_refusals``.

Example:
    $ IRIS_HEAP=shmem pytest tests -rs     # ... SKIPPED ... IRIS_HEAP=shmem: heap='shmem' needs torch.distributed ...
"""

from __future__ import annotations

import re

import pytest

from iris import config

# How a refusal reads in a traceback, whichever process printed it.
_REFUSAL = re.compile(r"HeapProviderRefusal: (.+)")


def refusal_in(text: str) -> str | None:
    """The first heap provider refusal named in ``text`` (a failure's report), or None."""
    found = _REFUSAL.search(text)
    return found[1].strip() if found else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    asked = config.heap_request()
    if not report.failed or not asked:
        return
    refusal = refusal_in(str(report.longrepr))
    if refusal:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: IRIS_HEAP={asked}: {refusal}")
