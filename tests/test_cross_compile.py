"""The cross-compile gate (iris.testing.cross_compile): real Triton compiles for sm_90 and gfx942 on a CPU.

The gate must fail a launch whose kernel a GPU compiler rejects, though the interpreter runs
it, and pass one that compiles; these tests run the real compilers (no GPU needed).
"""

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.runtime import SELECTED
from iris.testing.cross_compile import CrossCompileError, Gate, SharedMemoryError, Target, parse_targets, summary

pytestmark = [pytest.mark.slow,  # the slow tier (see pyproject.toml)
              pytest.mark.skipif(SELECTED != "cpu", reason="the gate checks the CPU backend's interpreted launches")]

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


@triton.jit
def _remote_store(src, dst, n, FROM: tl.constexpr, TO: tl.constexpr, BLOCK: tl.constexpr, heap_bases):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    iris.store(dst + offsets, tl.load(src + offsets, mask=mask), FROM, TO, heap_bases, mask=mask)


def test_debug_mode_kernels_compile_for_both_vendors(tmp_path):
    """Debug mode's translate (a checked block of pointers) compiles for sm_90 and gfx942 (gfx942 once
    rejected its select between a block of pointers and a scalar one, seen with a store to the own rank)."""
    from iris.host import debug

    src, dst = torch.zeros(1024, dtype=torch.float16), torch.zeros(1024, dtype=torch.float16)
    bases = torch.zeros(2, dtype=torch.int64)
    was = debug.compiled_in()
    debug.set_compile_constants(True)
    gate = Gate([CUDA, HIP], tmp_path)
    try:
        _check(gate, _remote_store, src, dst, 64, 0, 0, 1024, bases)  # rank 0 to rank 0
    finally:
        gate.close()
        debug.set_compile_constants(was)
    assert summary(tmp_path) == ["cuda:90: 1 specializations of 1 kernels compiled",
                                 "hip:gfx942: 1 specializations of 1 kernels compiled"]


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
    from iris.testing.cross_compile import _definitions_of

    script = tmp_path / "script.py"
    script.write_text("import triton.language as tl\nBLOCK = tl.constexpr(64)\n"
                      "def kernel(x):\n    return x\n"
                      "ctx = open('/nonexistent/iris-must-not-run-this')\n"
                      "rank = ctx.rank\nprev = (rank - 1) % 2\n")
    module = _definitions_of(str(script))
    assert module.kernel(3) == 3 and module.BLOCK.value == 64
    assert not hasattr(module, "ctx") and not hasattr(module, "prev")


_BARRIER_PTX = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from iris.device import sync
signature = {"arrivals": "*i64", "expected": "*i64", "members": "*i32", "count": "i32", "cur": "i32",
             "heap_bases": "*i64", "BLOCK": "constexpr"}
kernel = triton.compile(ASTSource(sync.barrier_kernel, signature, {"BLOCK": 8}), target=GPUTarget("cuda", 90, 32))
print(kernel.asm["ptx"].split(".section")[0])
"""


def test_the_device_barrier_loads_its_expected_counts_in_every_thread_before_one_thread_stores_them():
    """Every thread of a barrier round loads the expected counts and waits on them; one thread stores them
    incremented. Without a CTA barrier between, a warp that loads after the store waits for one round too
    many (all_reduce hung so through the engine path on an H200). The interpreter runs one thread and
    cannot show it: the sm_90 code must have a bar.sync between that load and that store."""
    import subprocess
    import sys

    from iris import config

    env = config.child_environment(drop=("TRITON_INTERPRET",), IRIS_COMPILE_TARGET="cuda:90")
    ptx = subprocess.run([sys.executable, "-c", _BARRIER_PTX], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    stores = [i for i, line in enumerate(ptx) if "st.global" in line]
    assert len(stores) == 1, stores  # the expected counts' store is the round's only global store
    address = ptx[stores[0]].split("[")[1].split("]")[0].strip()
    loads = [i for i, line in enumerate(ptx[: stores[0]]) if "ld.global" in line and f"[ {address}" in line]
    assert loads, (address, ptx)
    assert any("bar.sync" in line for line in ptx[loads[-1] : stores[0]]), ptx[loads[-1] : stores[0] + 1]


_BAD_KERNEL = '''
import torch
import triton
import triton.language as tl


@triton.jit
def raw_int64_cas(word):
    tl.atomic_cas(word, 1 << 33, 7)


def {name}():
    raw_int64_cas[(1,)](torch.zeros(1, dtype=torch.int64))
'''


@pytest.mark.parametrize("how", ["pytest", "--run"])
def test_a_test_or_script_whose_kernel_does_not_compile_fails_naming_it(tmp_path, how):
    """Through pytest's plugin, the test fails; through ``--run`` (as ``iris run`` starts ranks), the script,
    naming the kernel."""
    import subprocess
    import sys

    from iris import config

    env = config.child_environment(IRIS_CROSS_COMPILE="cuda:90", IRIS_CROSS_COMPILE_CACHE=str(tmp_path / "cache"))
    if how == "pytest":
        (tmp_path / "test_bad.py").write_text(_BAD_KERNEL.format(name="test_bad"))
        command = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "iris.testing.cross_compile_plugin",
                   str(tmp_path / "test_bad.py")]
    else:
        (tmp_path / "bad.py").write_text(_BAD_KERNEL.format(name="main") + "\nmain()\nprint('past the launch')\n")
        command = ["-m", "iris.testing.cross_compile", "--run", str(tmp_path / "bad.py")]
    result = subprocess.run([sys.executable, *command], env=env, cwd=tmp_path, capture_output=True, text=True,
                            timeout=300, check=False)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "raw_int64_cas does not compile for cuda:90" in output, output
    assert "1 failed" in output if how == "pytest" else "past the launch" not in output, output


@triton.jit
def _pipelined_dot(a, b, out, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    rows, cols, ks = tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):  # pipelined: num_stages copies of both tiles in shared memory
        acc += tl.dot(tl.load(a + rows[:, None] * K + (k + ks)[None, :]),
                      tl.load(b + (k + ks)[:, None] * BLOCK_N + cols[None, :]))
    tl.store(out + rows[:, None] * BLOCK_N + cols[None, :], acc.to(out.dtype.element_ty))


def test_a_tile_over_the_targets_shared_memory_fails_naming_its_need(tmp_path):
    """A launch the compiler takes but the GPU would refuse (OutOfResources: more shared memory per program than
    the GPU has) fails the gate, with the bytes needed and the target's; a smaller tile of the same kernel passes.
    An MI300X has 64 KiB per program, an H100 227 KiB: 128 x 256 x 64 bf16 tiles in 3 stages need about 96 KiB."""
    assert HIP.shared_memory_bytes == 65536 and CUDA.shared_memory_bytes == 232448
    a, b = torch.zeros(128 * 256, dtype=torch.bfloat16), torch.zeros(256 * 256, dtype=torch.bfloat16)
    out = torch.zeros(128 * 256, dtype=torch.bfloat16)
    gate = Gate([CUDA, HIP], tmp_path)
    try:
        with pytest.raises(SharedMemoryError, match=r"_pipelined_dot needs \d+ bytes of shared memory per program "
                                                    r"on hip:gfx942, which has 65536"):
            _check(gate, _pipelined_dot, a, b, out, 256, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3)
        verdicts = gate.verdicts(_pipelined_dot, (a, b, out, 256), dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64,
                                                                         num_stages=3))
        assert verdicts[CUDA] is None and isinstance(verdicts[HIP], SharedMemoryError), verdicts
        _check(gate, _pipelined_dot, a, b, out, 256, BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, num_stages=2)
    finally:
        gate.close()
