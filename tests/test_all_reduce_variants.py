"""all_reduce's shape: a front door of at most 150 lines, and one module per variant declaring its launch and
its facts with one signature; hierarchical composes the variants directly, and no variant calls back through
``ctx.ccl``."""

import ast
import inspect
from pathlib import Path

import pytest

import iris  # noqa: F401
from iris.ccl import all_reduce
from iris.ccl.all_reduce import BARRIER_FREE, IN_PLACE, VARIANTS, far_path_refusal, input_on_heap
from iris.ccl.all_reduce.variant import Variant
from iris.ccl.config import ALL_REDUCE_VARIANTS

PACKAGE = Path(all_reduce.__file__).resolve().parent
SIGNATURE = ["ctx", "output", "input", "op", "config", "workspace", "async_op"]

# variant: (its module, in place, fused only, local output, barrier free, input on the heap without / with the
# engine, refused across nodes)
FACTS = {
    "one_shot": ("one_shot", False, False, True, False, True, True, False),
    "two_shot": ("two_shot", True, False, False, False, True, True, False),
    "atomic": ("atomic", False, True, False, False, True, True, True),
    "spinlock": ("spinlock", False, True, False, False, True, True, True),
    "ring": ("ring", False, True, False, False, True, True, True),
    "push": ("push", True, False, True, True, False, True, False),
    "ll": ("push", True, False, True, True, False, False, False),
    "hierarchical": ("hierarchical", True, False, False, False, True, True, False),
}


def test_the_front_door_is_at_most_150_lines():
    assert len((PACKAGE / "__init__.py").read_text().splitlines()) <= 150


def test_every_variant_is_declared_with_its_facts_in_its_own_module():
    assert sorted(VARIANTS) == sorted(ALL_REDUCE_VARIANTS) == sorted(FACTS)
    for name, (module, in_place, fused_only, local, barrier_free, on_heap, by_engine, refused) in FACTS.items():
        variant = VARIANTS[name]
        assert isinstance(variant, Variant) and variant.name == name
        assert variant.launch.__module__ == f"iris.ccl.all_reduce.{module}", name
        assert (variant.in_place, variant.fused_only, variant.local_output, variant.barrier_free) == \
            (in_place, fused_only, local, barrier_free), name
        assert (input_on_heap(name, False), input_on_heap(name, True)) == (on_heap, by_engine), name
        assert (far_path_refusal(name, True) is not None) == refused and far_path_refusal(name, False) is None
    assert sorted(IN_PLACE) == ["hierarchical", "ll", "push", "two_shot"] and sorted(BARRIER_FREE) == ["ll", "push"]
    assert far_path_refusal(None, True) is None  # no variant named: the default, never refused


@pytest.mark.parametrize("name", sorted(FACTS))
def test_every_variant_launches_with_one_signature(name):
    assert list(inspect.signature(VARIANTS[name].launch).parameters) == SIGNATURE


def _door_names(path: Path) -> set[str]:
    """What a module imports from the door itself (its submodules, imported by name from the package, aside)."""
    tree = ast.parse(path.read_text())
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
            and node.module == "iris.ccl.all_reduce" for alias in node.names
            if not (PACKAGE / f"{alias.name}.py").exists()}


def test_no_variant_calls_back_through_the_context_or_the_door():
    """A variant module's code reaches the others by importing them, never ``ctx.ccl`` (whose all_reduce is the
    door) nor the door itself (hierarchical received the door's all_reduce as a callback once)."""
    for path in PACKAGE.glob("*.py"):
        if path.name == "__init__.py":
            continue
        calls = [node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Attribute)]
        assert "ccl" not in {node.attr for node in calls}, path.name
        assert _door_names(path) == set(), path.name
        assert "flat_all_reduce" not in path.read_text(), path.name
