"""The tiles a GPU runs, through the cross-compile gate (iris.testing.cross_compile; no GPU needed).

On the CPU backend every GEMM launches one small tile of its own (``iris.ops.gemm.INTERPRETED_TILE``), so the
default tier's gate never compiles the tiles a GPU picks. These tests compile, for an H100/H200 (sm_90) and an
MI300X (gfx942) with the launch constants that vendor's backend gives them, each candidate ``iris.ops.matmul``'s
two autotuners would try at a spread of shapes, and the fused kernels at the tiles ``fitted_launch`` picks on a
GPU. An autotuner's candidate may need more shared memory than the target's GPUs have (the autotuner skips it
there: Triton raises OutOfResources at its launch), but it must compile, and at every shape each target must
keep one that fits; a fused op's tile must fit. As listed, gfx942 has none that fits (strict xfails); with
IRIS_GEMM_FIT_TILES=1 every tile tried fits both targets.
"""

from __future__ import annotations

import pytest
import torch

from iris.ops import gemm
from iris.runtime import SELECTED, backend_class
from iris.testing.cross_compile import Gate, SharedMemoryError, Target

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(SELECTED != "cpu", reason="the gate compiles the CPU backend's kernels for GPUs")]

TARGETS = {"cuda": Target("cuda", 90), "hip": Target("hip", "gfx942")}
#: (M, N, K): decode rows (the split kernel's decode tiles), the rows from which large tiles compete, large M
SHAPES = [(1, 4096, 4096), (16, 8192, 8192), (64, 14336, 8192), (128, 8192, 8192), (1024, 8192, 14336),
          (4096, 14336, 8192)]
AUTOTUNERS = {"persistent": gemm._tuned_gemm_kernel, "split": gemm._tuned_split_kernel}
#: each autotuner's pruning as listed (IRIS_GEMM_FIT_TILES=0), and as IRIS_GEMM_FIT_TILES=1 makes it at import
PRUNES = {("persistent", "0"): gemm._fitting, ("split", "0"): gemm._by_rows,
          ("persistent", "1"): gemm.fitted(gemm._fitting), ("split", "1"): gemm.fitted(gemm._by_rows, split=True)}


class TargetGpu:
    """What the pruning asks a GPU backend, for the gate's target of ``vendor`` (no GPU here): the target's shared
    memory per program and the vendor backend's own pipeline fact."""

    def __init__(self, vendor: str):
        self.pipeline_buffers = backend_class(vendor).pipeline_buffers
        self.limit = TARGETS[vendor].shared_memory_bytes

    def shared_memory_per_program(self, device) -> int:
        return self.limit


def candidates(autotuner, prune, vendor: str, shape) -> list[tuple]:
    """(config, args, constants) of each launch ``autotuner`` tries on a ``vendor`` GPU for a bf16 ``shape``
    (row-major operands, no bias): its configurations after ``prune``, with the constants matmul passes there.
    The tensors only give dtypes and alignment (what the compiler specializes on)."""
    m, n, k = shape
    facts = backend_class(vendor)
    operands = [torch.empty(64, dtype=torch.bfloat16) for _ in range(4)]  # a, b, out, bias
    workspace = [torch.empty(64, dtype=torch.float32), torch.empty(64, dtype=torch.int32)]
    split = "parts" in autotuner.arg_names
    args = (*operands, *(workspace if split else []), m, n, k, k, 1, n, 1, n, 1)
    constants = dict(HAS_BIAS=False, UPCAST=facts.upcasts_narrow_floats)
    if split:
        constants["TMA"] = facts.tensor_descriptors
    configs = prune(autotuner.configs, dict(zip(autotuner.arg_names, args)))
    return [(config, args, dict(constants, **config.all_kwargs())) for config in configs]


def _label(config) -> str:
    kw = config.kwargs
    return (f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{config.num_warps} s{config.num_stages}"
            + (f" split{kw['SPLIT']}" if "SPLIT" in kw else ""))


_NO_AMD_TILE = pytest.mark.xfail(strict=True, raises=AssertionError,
                                 reason="gfx942 (MI300X, 64 KiB of LDS per program): no tile of the persistent "
                                        "kernel's list fits at any shape, none of the large tiles from M = 129")


@pytest.mark.parametrize("fit", ["0", "1"], ids=["as_listed", "fit_tiles"])
@pytest.mark.parametrize("vendor", ["cuda", "hip"])
@pytest.mark.parametrize("name", list(AUTOTUNERS))
def test_every_candidate_compiles_and_one_fits_at_every_shape(name, vendor, fit, tmp_path, monkeypatch, request):
    """As listed, every tile fits sm_90; with IRIS_GEMM_FIT_TILES=1 the autotuners keep the tiles that fit the
    GPU's shared memory, or else take tiles that do: then every tile tried fits, on gfx942 too."""
    if vendor == "hip" and fit == "0":
        request.applymarker(_NO_AMD_TILE)
    target = TARGETS[vendor]
    monkeypatch.setattr(gemm, "get_backend", lambda: TargetGpu(vendor))
    gate = Gate([target], tmp_path)
    none_fit = []
    try:
        for shape in SHAPES:
            tried = candidates(AUTOTUNERS[name], PRUNES[name, fit], vendor, shape)
            assert tried, f"{name}: no candidate at {shape}"
            verdicts = {_label(config): gate.verdicts(AUTOTUNERS[name].fn, args, constants)[target]
                        for config, args, constants in tried}
            refused = {label: error for label, error in verdicts.items()
                       if error is not None and not isinstance(error, SharedMemoryError)}
            assert not refused, f"{name} at {shape} on {target.name}: {refused}"
            over = [label for label, error in verdicts.items() if error is not None]
            assert fit == "0" or not over, f"{name} at {shape} on {target.name}, fitted, still tries {over}"
            if all(error is not None for error in verdicts.values()):
                none_fit.append(f"{shape}: {', '.join(verdicts)}")
    finally:
        gate.close()
    assert not none_fit, (f"{name} on {target.name}: no candidate fits its {target.shared_memory_bytes} bytes of "
                          f"shared memory at\n" + "\n".join(none_fit))


def test_the_autotuners_prune_as_the_switch_said_at_import():
    """IRIS_GEMM_FIT_TILES is read when iris.ops.gemm is imported: off (the default), the lists' own pruning."""
    from iris import config

    fitting = config.gemm_fit_tiles()
    for name, autotuner in AUTOTUNERS.items():
        prune = autotuner.early_config_prune
        assert (prune.__qualname__ == "fitted.<locals>.within") == fitting, (name, prune)


_RECORD_FUSED_LAUNCHES = """
import pickle, sys, torch, iris
from triton.runtime.interpreter import InterpretedFunction
recorded, run = {}, InterpretedFunction.run
def recording(self, *args, grid, warmup, **kwargs):
    if "BLOCK_M" in kwargs:
        recorded.setdefault((self.fn.__module__, self.fn.__qualname__), (args, kwargs))
    return run(self, *args, grid=grid, warmup=warmup, **kwargs)
InterpretedFunction.run = recording
ctx = iris.iris(1 << 26)
a, b = ctx.randn(64, 64, dtype=torch.bfloat16), ctx.randn(64, 64, dtype=torch.bfloat16)
ctx.ops.matmul_all_reduce(ctx.zeros(64, 64, dtype=torch.bfloat16), a, b)
split = iris.ops.FusedConfig(split_k=2)  # the K split's workspace in the arguments, as a GPU's split launch has it
ctx.ops.matmul_all_gather(ctx.zeros(64, 64, dtype=torch.bfloat16), a, b, config=split)
plain = {key: (tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in args), kwargs)
         for key, (args, kwargs) in recorded.items()}
with open(sys.argv[1], "wb") as file:
    pickle.dump(plain, file)
"""


@pytest.fixture(scope="module")
def fused_launches(tmp_path_factory):
    """{kernel: (args, constants)} of the fused kernels as one rank's CPU run launches them (tile aside)."""
    import importlib
    import pickle
    import subprocess
    import sys

    from iris import config

    path = tmp_path_factory.mktemp("fused") / "launches.pickle"
    subprocess.run([sys.executable, "-c", _RECORD_FUSED_LAUNCHES, str(path)], check=True, timeout=300,
                   env=config.child_environment(drop=("IRIS_CROSS_COMPILE",)))
    with open(path, "rb") as file:
        recorded = pickle.load(file)
    assert len(recorded) == 2, recorded.keys()
    return {getattr(importlib.import_module(module), name): launch for (module, name), launch in recorded.items()}


@pytest.mark.parametrize("fit", ["0", "1"], ids=["as_listed", "fit_tiles"])
@pytest.mark.parametrize("vendor", ["cuda", "hip"])
def test_the_fused_kernels_gpu_tiles_compile_and_fit(fused_launches, vendor, fit, tmp_path, request):
    """The tiles a GPU's fused ops take for FusedConfig() (fitted_launch at decode and large rows), compiled for
    the vendor's target: they fit sm_90; on gfx942 the default and small tiles do not (98304 and 73728 bytes of
    64 KiB) unless IRIS_GEMM_FIT_TILES fits them."""
    from iris.ops._fused import SPLITS, fitted_launch
    from iris.ops.config import FusedConfig

    if vendor == "hip" and fit == "0":
        request.applymarker(pytest.mark.xfail(strict=True, raises=AssertionError,
                                              reason="gfx942: FusedConfig()'s default and small tiles need more "
                                                     "than 64 KiB of LDS"))
    target, facts = TARGETS[vendor], backend_class(vendor)
    within = (facts, target.shared_memory_bytes) if fit == "1" else None
    gate = Gate([target], tmp_path)
    over = []
    try:
        for kernel, (args, constants) in fused_launches.items():
            for rows, cols in ((64, 8192), (4096, 8192)):
                launch = fitted_launch(FusedConfig(), rows, cols, 132, torch.bfloat16,
                                       SPLITS if "SPLIT" in constants else None, within)
                error = gate.verdicts(kernel, args, dict(constants, UPCAST=facts.upcasts_narrow_floats,
                                                         **launch))[target]
                assert error is None or isinstance(error, SharedMemoryError), str(error)
                if error is not None:
                    over.append(f"{kernel.fn.__name__} at {rows} x {cols}: {error}")
    finally:
        gate.close()
    assert not over, "\n".join(over)
