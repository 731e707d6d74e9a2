"""The cross-compile gate (iris.runtime.cross_compile): real Triton compiles for sm_90 and gfx942 on a CPU.

The gate must fail a launch whose kernel a GPU compiler rejects, though the interpreter runs
it, and pass one that compiles; these tests run the real compilers (no GPU needed).
"""

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.runtime import SELECTED
from iris.runtime.cross_compile import CrossCompileError, Gate, Target, parse_targets, summary

pytestmark = pytest.mark.skipif(SELECTED != "cpu", reason="the gate checks the CPU backend's interpreted launches")

CUDA, HIP = Target("cuda", 90), Target("hip", "gfx942")


@triton.jit
def _raw_int64_cas(word):
    # Python-int operands straight into Triton: the interpreter accepts them, the GPU compilers do not
    tl.atomic_cas(word, 1 << 33, 7)


@triton.jit
def _iris_int64_cas(word, heap_bases):
    iris.atomic_cas(word, 1 << 33, 7, 0, 0, heap_bases)  # iris converts the operands to the word's type


@triton.jit
def _ptx_only(out):
    lane = tl.inline_asm_elementwise("mov.u32 $0, %laneid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(out, lane)


def test_parse_targets():
    assert parse_targets("cuda:90, hip:gfx942,") == [CUDA, HIP]
    assert parse_targets("") == []
    for bad in ("cuda", "cuda:sm90", "hip:942", "rocm:gfx942"):
        with pytest.raises(ValueError, match="is not a target"):
            parse_targets(bad)


def _check(gate, kernel, *args, **constexprs):
    gate.check(kernel, args, constexprs)


def test_a_kernel_the_compilers_reject_fails_naming_kernel_and_target(tmp_path):
    gate = Gate([CUDA, HIP], tmp_path)
    word = torch.zeros(1, dtype=torch.int64)
    try:
        with pytest.raises(CrossCompileError, match=r"_raw_int64_cas does not compile for cuda:90(.|\n)*"
                                                    r"ptr type matches value type"):
            _check(gate, _raw_int64_cas, word)
    finally:
        gate.close()


def test_iris_atomic_cas_with_python_ints_compiles_for_both_vendors(tmp_path):
    gate = Gate([CUDA, HIP], tmp_path)
    word, bases = torch.zeros(1, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)
    try:
        _check(gate, _iris_int64_cas, word, bases)
    finally:
        gate.close()
    lines = summary(tmp_path)
    assert lines == ["cuda:90: 1 specializations of 1 kernels compiled",
                     "hip:gfx942: 1 specializations of 1 kernels compiled"], lines
    # a second gate (another rank, a later run) finds the results and starts no compiler
    again = Gate([CUDA, HIP], tmp_path)
    _check(again, _iris_int64_cas, word, bases)
    assert again._workers == {}


def test_the_amd_compile_is_real(tmp_path):
    """NVIDIA inline assembly compiles for sm_90 and fails for gfx942."""
    out = torch.zeros(1, dtype=torch.int32)
    gate = Gate([CUDA], tmp_path)
    try:
        _check(gate, _ptx_only, out)
    finally:
        gate.close()
    gate = Gate([HIP], tmp_path)
    try:
        with pytest.raises(CrossCompileError, match="_ptx_only does not compile for hip:gfx942"):
            _check(gate, _ptx_only, out)
    finally:
        gate.close()


def test_specializations_are_told_apart(tmp_path):
    """An int64 pointer and an int32 one, or an aligned and a misaligned one, are separate compiles."""
    gate = Gate([CUDA], tmp_path)
    bases = torch.zeros(2, dtype=torch.int64)
    try:
        _check(gate, _iris_int64_cas, torch.zeros(1, dtype=torch.int64), bases)
        _check(gate, _iris_int64_cas, torch.zeros(1, dtype=torch.int32), bases)
        _check(gate, _iris_int64_cas, torch.zeros(3, dtype=torch.int32)[1:], bases)
    finally:
        gate.close()
    assert summary(tmp_path) == ["cuda:90: 3 specializations of 1 kernels compiled"]


def test_a_launched_script_gives_its_definitions_without_running(tmp_path):
    """A kernel in a script (``__main__``) is found by running only the script's definitions."""
    from iris.runtime.cross_compile import _definitions_of

    script = tmp_path / "script.py"
    script.write_text("import triton.language as tl\nBLOCK = tl.constexpr(64)\n"
                      "def kernel(x):\n    return x\n"
                      "ctx = open('/nonexistent/iris-must-not-run-this')\n"
                      "rank = ctx.rank\nprev = (rank - 1) % 2\n")
    module = _definitions_of(str(script))
    assert module.kernel(3) == 3 and module.BLOCK.value == 64
    assert not hasattr(module, "ctx") and not hasattr(module, "prev")
