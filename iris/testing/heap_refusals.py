"""A pytest plugin: under ``IRIS_HEAP``, a test whose job that heap provider refuses is skipped, with the refusal.

Why: some jobs a provider cannot serve by design (shmem on the CPU backend, without torch.distributed). A
refusal with ``IRIS_HEAP`` unset stays a failure. Load it with ``-p iris.testing.heap_refusals``.

Example:
    $ IRIS_HEAP=shmem pytest tests -rs     # ... SKIPPED ... IRIS_HEAP=shmem: heap='shmem' needs torch.distributed ...
"""

from __future__ import annotations

import re

import pytest

from iris import config

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
