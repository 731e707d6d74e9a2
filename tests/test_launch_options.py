"""AMD-only launch options (waves_per_eu, matrix_instr_nonkdim, kpack, ...) run on every target
(iris.runtime.launch_options): dropped off AMD with one warning per name, an unknown option still refused."""

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.runtime import launch_options

AMD_OPTIONS = dict(waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)


@triton.jit
def _scale(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * factor, mask=mask)


@triton.jit
def _with_kpack_parameter(out_ptr, kpack):
    tl.store(out_ptr, kpack)


@pytest.fixture(scope="module")
def ctx():
    context = iris.iris(1 << 20)
    yield context
    context.close()


def _launch(ctx, **options):
    n = 300
    x = ctx.randn(n)
    out = ctx.full((n,), float("nan"))
    _scale[(triton.cdiv(n, 128),)](x, out, n, 3.0, BLOCK=128, num_warps=4, **options)
    return x, out


def test_amd_options_run_and_warn_once_per_name(ctx, capsys, monkeypatch):
    monkeypatch.delenv("IRIS_QUIET_AMD_OPTIONS", raising=False)
    launch_options.forget_announcements()
    for _ in range(3):
        x, out = _launch(ctx, **AMD_OPTIONS)
        torch.testing.assert_close(out, x * 3.0)
    err = capsys.readouterr().err
    expected = 0 if ctx.backend.name == "hip" else 1  # kept on AMD; dropped and said once elsewhere
    for name in AMD_OPTIONS:
        assert err.count(f"launch option {name}=") == expected, err
    if expected:
        assert "[Iris] [0/1] launch option waves_per_eu=2 ignored" in err


def test_the_warning_can_be_silenced(ctx, capsys, monkeypatch):
    monkeypatch.setenv("IRIS_QUIET_AMD_OPTIONS", "1")
    launch_options.forget_announcements()
    x, out = _launch(ctx, **AMD_OPTIONS)
    torch.testing.assert_close(out, x * 3.0)
    assert "launch option" not in capsys.readouterr().err


def test_an_option_no_target_knows_is_still_an_error(ctx):
    with pytest.raises(KeyError, match="waves_per_cu"):
        _launch(ctx, waves_per_cu=2)


def test_a_kernel_parameter_of_that_name_is_an_argument(ctx):
    out = ctx.zeros(1, dtype=torch.int32)
    _with_kpack_parameter[(1,)](out, kpack=7)
    assert out.item() == 7


def test_the_filter(ctx):
    kwargs = dict(BLOCK=64, num_warps=4, kpack=2, waves_per_eu=1)
    assert launch_options.for_target("hip", kwargs, ["x", "BLOCK"]) is kwargs
    assert launch_options.for_target("cuda", kwargs, ["x", "BLOCK"]) == dict(BLOCK=64, num_warps=4)
    assert launch_options.for_target("cuda", kwargs, ["x", "kpack"]) == dict(BLOCK=64, num_warps=4, kpack=2)
    assert launch_options.AMD_ONLY <= launch_options.known_options()


@pytest.mark.skipif(not torch.cuda.is_available() or getattr(torch.version, "hip", None) is not None,
                    reason="the NVIDIA path: needs a CUDA GPU (runs in the GPU gate)")
def test_amd_options_on_nvidia(ctx, capsys):
    assert ctx.backend.name == "cuda"
    launch_options.forget_announcements()
    x, out = _launch(ctx, **AMD_OPTIONS)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x * 3.0)
    assert "launch option kpack=2 ignored" in capsys.readouterr().err
    with pytest.raises(KeyError, match="waves_per_cu"):
        _launch(ctx, waves_per_cu=2)  # Triton's own refusal, unchanged
