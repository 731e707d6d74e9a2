"""Every public name exists and says what it does."""

import subprocess
import sys

import pytest

import iris


def test_every_public_name_exists_and_is_documented():
    undocumented = []
    for name in iris.__all__:
        obj = getattr(iris, name)  # AttributeError names a missing export
        if isinstance(obj, int):  # log levels
            continue
        doc = getattr(obj, "__doc__", None) or getattr(getattr(obj, "fn", None), "__doc__", None)
        if not doc or len(doc.strip()) < 20:
            undocumented.append(name)
    assert not undocumented, f"public names without a docstring: {undocumented}"


@pytest.mark.slow  # a fresh interpreter: the slow tier (the README command stays under 5 minutes)
def test_the_plug_ins_are_there_after_a_bare_import():
    """``import iris`` alone gives ``iris.ccl`` and ``iris.ops`` (code written for the original uses
    ``iris.ccl.Config`` so); in a fresh process, where no test imported them first."""
    probe = "import iris; print(iris.ccl.Config.__name__, iris.ccl.ReduceOp.__name__, iris.ops.FusedConfig.__name__)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["Config", "ReduceOp", "FusedConfig"], out.stderr
