"""iris.ops.matmul, the package's persistent GEMM, against a float64 reference (CPU: Triton's interpreter)."""

import zlib

import pytest
import torch

import iris

# Relative error allowed by the output's dtype (float32 accumulation of exact bf16/fp16 products).
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _device():
    return "cuda" if torch.cuda.is_available() else "cpu"


# float32 operands: exact products on the interpreter, tl.dot's TF32 (10-bit mantissa) on GPUs
_FLOAT32_DOT_TOLERANCE = 2e-3 if torch.cuda.is_available() else 1e-5


@pytest.mark.parametrize("tuned", ["0", "1"])
def test_a_repeated_matmul_reads_each_calls_own_tensors(tuned, monkeypatch):
    """matmul remembers how it launched a call's kind (dtypes, shapes, strides, alignment; on GPUs the compiled
    kernel, its tile and grid, skipping the autotuner and Triton's argument binding): a later call must still read
    its own operands, bias and output, also where they are views that start off Triton's 16-byte alignment
    (another specialization), where b is a transposed view, out is made by matmul, or there is no bias; and a
    call of the wrong shape after them is still refused."""
    monkeypatch.setenv("IRIS_GEMM_TUNED", tuned)
    m, n, k = 24, 40, 48
    g = torch.Generator().manual_seed(7)

    def view(shape, offset, transposed=False):
        """a bf16 tensor of ``shape``, ``offset`` elements into a larger buffer (transposed: a (n, k) tensor's .t())"""
        rows, cols = shape
        size = rows * cols
        buffer = torch.randn(size + offset, generator=g).to(torch.bfloat16).to(_device())
        return buffer[offset:].view(cols, rows).t() if transposed else buffer[offset:].view(rows, cols)

    cases = [(0, False, True, True), (0, False, True, True), (1, False, True, True), (0, True, True, True),
             (0, False, False, True), (0, False, True, False), (1, False, True, True), (0, False, False, False)]
    for offset, transposed, given_out, with_bias in cases:
        what = f"offset {offset}, b transposed {transposed}, out given {given_out}, bias {with_bias}"
        a, b = view((m, k), offset), view((k, n), offset, transposed)
        bias = view((1, n), offset).view(n) if with_bias else None
        out = view((m, n), offset).fill_(float("nan")) if given_out else None
        result = iris.ops.matmul(a, b, out=out, bias=bias)
        assert out is None or result is out, what
        ref = a.double() @ b.double() + (bias.double() if with_bias else 0)
        assert result.shape == (m, n) and result.dtype == torch.bfloat16, what
        assert not result.isnan().any(), f"elements left unwritten ({what})"
        error = ((result.double() - ref).norm() / ref.norm()).item()
        assert error <= TOLERANCE[torch.bfloat16], f"relative error {error:.3g} ({what})"
    with pytest.raises(ValueError, match="inner sizes differ"):
        iris.ops.matmul(view((m, k + 1), 0), view((k, n), 0))
    with pytest.raises(ValueError, match="out must be"):
        iris.ops.matmul(view((m, k), 0), view((k, n), 0), out=view((m, n + 1), 0))


@pytest.mark.parametrize("shape", [(37, 45, 70), (64, 32, 16), (1, 33, 17), (50, 1, 9), (96, 80, 100)])
@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.bfloat16),
                                             (torch.float16, torch.float16), (torch.float16, torch.float32)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matmul_matches_float64(shape, dtype, out_dtype, with_bias):
    m, n, k = shape
    seed = zlib.crc32(repr((shape, dtype, out_dtype, with_bias)).encode())
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype).to(_device())
    b = torch.randn(n, k, generator=g).to(dtype).to(_device()).t()  # a transposed view: strides (1, k)
    bias = torch.randn(n, generator=g).to(_device()) if with_bias else None
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device=_device())  # poison: every element written
    result = iris.ops.matmul(a, b, out=out, bias=bias)
    assert result is out
    ref = a.double() @ b.double() + (bias.double() if with_bias else 0)
    error = ((out.double() - ref).norm() / ref.norm()).item()
    assert not out.isnan().any(), "elements left unwritten"
    assert error <= TOLERANCE[out_dtype], f"relative error {error:.3g} (seed {seed})"


def test_matmul_makes_its_output_in_the_operands_dtype():
    a = torch.ones(20, 24, dtype=torch.bfloat16, device=_device())
    b = torch.ones(24, 40, dtype=torch.bfloat16, device=_device())
    out = iris.ops.matmul(a, b)
    assert out.dtype == torch.bfloat16 and out.shape == (20, 40) and (out == 24).all()


@pytest.mark.parametrize("call,message", [
    (lambda a, b: iris.ops.matmul(a, b[:7]), "inner sizes differ"),
    (lambda a, b: iris.ops.matmul(a.double(), b.double()), "supported: bfloat16, float16, float32"),
    (lambda a, b: iris.ops.matmul(a, b, bias=torch.zeros(3, device=a.device)), "bias must be 1-D of length 16"),
    (lambda a, b: iris.ops.matmul(a, b, out_dtype=torch.int32), "out_dtype"),
    (lambda a, b: iris.ops.matmul(a, b, out=torch.empty(8, 15, device=a.device)), "out must be (8, 16)"),
])
def test_matmul_refuses_bad_arguments_before_any_launch(call, message):
    a = torch.zeros(8, 12, dtype=torch.float16, device=_device())
    b = torch.zeros(12, 16, dtype=torch.float16, device=_device())
    with pytest.raises((TypeError, ValueError)) as info:
        call(a, b)
    assert message in str(info.value)


@pytest.mark.parametrize("programs", [None, 1, 2])
@pytest.mark.parametrize("split", [1, 2, 3])
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("shape", [(16, 40, 100), (5, 64, 64), (33, 24, 132), (16, 16, 48)])  # rows 16-byte aligned
def test_split_k_kernel_matches_float64(split, tma, shape, programs):
    """matmul's tuned kernel (IRIS_GEMM_TUNED) with each tile's K range in ``split`` parts, summed by the program
    whose part arrives last, on one program per work unit (``programs`` None) or fewer, each taking every
    programs-th unit: no program waits for one that has not started (on a GPU: programs need not all be resident;
    the interpreter runs them one after another). At (16, 16, 48) in three parts on two programs, the first
    program holds the tile's parts 0 and 2, the second part 1."""
    from iris.ops.gemm import _split_gemm_kernel, split_workspace, tile_count, tma_ready

    m, n, k = shape
    g = torch.Generator().manual_seed(m * 1000 + n + k)
    a = torch.randn(m, k, generator=g).to(_device())
    b = torch.randn(k, n, generator=g).to(_device())
    bias = torch.randn(n, generator=g).to(_device())
    out = torch.full((m, n), float("nan"), device=_device())
    if tma and not tma_ready(iris.runtime.get_backend(), a.device, a, b):  # installs the descriptors' allocator
        pytest.skip("no tensor descriptors on this backend")
    tile = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, SPLIT=split)
    parts, ready = split_workspace(a.device, m, n, [tile])
    for _ in range(2):  # the counts the first call leaves serve the second
        out.fill_(float("nan"))
        _split_gemm_kernel[(programs or tile_count(m, n, tile) * split,)](
            a, b, out, bias, parts, ready, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
            out.stride(1), HAS_BIAS=True, UPCAST=False, TMA=tma, **tile)
        ref = a.double() @ b.double() + bias.double()
        assert not out.isnan().any(), "elements left unwritten"
        assert ((out.double() - ref).norm() / ref.norm()).item() <= _FLOAT32_DOT_TOLERANCE
        assert int(ready.sum()) == 0


@pytest.mark.parametrize("m, n, k", [(1, 64, 64), (16, 256, 128), (64, 96, 1000), (100, 4096, 512),
                                     (16, 8192, 8192), (128, 14336, 8192), (4096, 8192, 8192)])
def test_the_tuned_kernel_times_no_tile_larger_than_the_problem(m, n, k):
    """The tuned kernel's autotuner (IRIS_GEMM_TUNED) compiles and times only tiles the shape can use: none wider
    than N needs (past 64 columns) and no K split into more parts than the K range has blocks (a part with nothing
    to sum); at the decode shapes of a model every narrow tile stays a candidate."""
    from triton import cdiv, next_power_of_2

    from iris.ops import gemm

    kept = gemm._by_rows(gemm._tuned_split_kernel.configs, dict(M=m, N=n, K=k))
    assert kept
    for tile in (c.kwargs for c in kept):
        assert tile["BLOCK_N"] <= max(64, next_power_of_2(n)), tile
        assert tile["SPLIT"] <= cdiv(k, tile["BLOCK_K"]), tile
    if (m, n, k) == (16, 8192, 8192):  # a model's shape: the six 16-row tiles, split in 1, 2 and 4 parts
        assert sum(c.kwargs["BLOCK_M"] == 16 for c in kept) == 6

