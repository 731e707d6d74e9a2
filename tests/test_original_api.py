"""Every public name of the original Iris (its July-2025 release and the newest one we read) exists here.

The names are data, in tests/data/original_api.json, gathered from the original's source. A name under
its ``pending`` key is one we do not have yet, with the reason; its check is a strict xfail, so the day
the name appears the test says so and the entry must leave the list. Every other name must exist.
"""

import dataclasses
import json
from pathlib import Path

import pytest

import iris

DATA = json.loads((Path(__file__).parent / "data" / "original_api.json").read_text())
PENDING = DATA["pending"]
CHECKS = [(owner, name) for owner, names in DATA["names"].items() for name in names]


@pytest.fixture(scope="module")
def context():
    ctx = iris.iris(1 << 16)
    yield ctx
    ctx.close()


def _has(owner: str, name: str, ctx) -> bool:
    if owner == "iris":
        return hasattr(iris, name)
    if owner == "Iris":
        return hasattr(iris.Iris, name) or hasattr(ctx, name)
    if owner == "iris.ccl.CCL":
        return hasattr(iris.ccl.CCL, name)
    if owner in ("iris.ccl", "iris.ops", "iris.compile"):
        return hasattr({"iris.ccl": iris.ccl, "iris.ops": iris.ops, "iris.compile": iris.compile}[owner], name)
    config = {"iris.ccl.Config": iris.ccl.Config, "iris.ops.FusedConfig": iris.ops.FusedConfig}[owner]
    return name in {field.name for field in dataclasses.fields(config)}


def test_the_data_is_consistent():
    """Every pending entry names a listed name and gives a reason; no name is listed twice."""
    listed = {f"{owner}.{name}" for owner, name in CHECKS}
    assert len(listed) == len(CHECKS)
    assert sorted(set(PENDING) - listed) == []
    assert all(reason.strip() for reason in PENDING.values())
    july = ["do_bench", "memset_tensor"]
    july_iris = ["log", "log_debug", "log_stats", "parse_size", "deallocate", "wall_clock_rate"]
    assert all(("iris", n) in CHECKS for n in july) and all(("Iris", n) in CHECKS for n in july_iris)
    assert not any(f"iris.{n}" in PENDING for n in july) and not any(f"Iris.{n}" in PENDING for n in july_iris)


@pytest.mark.parametrize("owner, name", CHECKS, ids=[f"{o}.{n}" for o, n in CHECKS])
def test_original_name_exists(owner, name, context):
    key = f"{owner}.{name}"
    if key in PENDING:
        if _has(owner, name, context):
            pytest.fail(f"{key} exists now: take it out of 'pending' in tests/data/original_api.json")
        pytest.xfail(f"pending: {PENDING[key]}")
    assert _has(owner, name, context), f"Iris lacks the original's {key}"
