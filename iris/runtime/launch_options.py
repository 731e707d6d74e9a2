"""AMD-only launch options on the other targets: dropped with one warning per name, kept on AMD.

Why: kernels tuned for AMD pass options (``waves_per_eu``, ``kpack``) that Triton's NVIDIA backend refuses and
its interpreter drops silently. On the CPU backend an option no target knows is an error, as on a GPU.

Example:
    >>> kernel[grid](x, n, BLOCK=1024, waves_per_eu=2, kpack=2)   # runs on NVIDIA, AMD and the CPU
    [Iris] [0/2] launch option waves_per_eu=2 ignored: only AMD GPUs know it (this is cuda) ...
"""

from __future__ import annotations

import functools

from iris import config
from iris.runtime.logging import WARNING, log

#: Options of Triton's AMD backend that its NVIDIA one lacks.
AMD_ONLY = frozenset({"waves_per_eu", "matrix_instr_nonkdim", "kpack", "schedule_hint",
                      "instruction_sched_variant"})

_state = {"installed": None, "rank": "?", "num_ranks": "?"}
_announced: set[str] = set()


@functools.lru_cache(maxsize=None)
def known_options() -> frozenset:
    """Every launch option some target knows: Triton's NVIDIA and AMD options, autotuning's, AMD_ONLY."""
    import triton

    names = set(AMD_ONLY) | set(triton.Config({}).all_kwargs()) | {"ir_override", "maxnreg", "debug"}
    for module, cls in (("triton.backends.nvidia.compiler", "CUDAOptions"),
                        ("triton.backends.amd.compiler", "HIPOptions")):
        try:
            names |= set(getattr(__import__(module, fromlist=[cls]), cls).__dataclass_fields__)
        except (ImportError, AttributeError):  # a wheel without that backend
            pass
    return frozenset(names)


def for_target(vendor: str | None, kwargs: dict, params) -> dict:
    """A launch's ``kwargs`` for ``vendor``: off ``"hip"``, :data:`AMD_ONLY` options not in ``params`` dropped.

    Example:
        >>> for_target("cuda", {"BLOCK": 64, "kpack": 2}, ["x", "BLOCK"])
        {'BLOCK': 64}
    """
    if vendor == "hip" or AMD_ONLY.isdisjoint(kwargs):
        return kwargs
    return {k: v for k, v in kwargs.items() if k not in AMD_ONLY or k in params}


def _announce(kwargs: dict, params, target: str) -> None:
    for name in sorted(AMD_ONLY.intersection(kwargs).difference(params).difference(_announced)):
        _announced.add(name)
        if not config.quiet_amd_options():
            log(WARNING, f"launch option {name}={kwargs[name]!r} ignored: only AMD GPUs know it (this is {target}); "
                         f"said once per option, IRIS_QUIET_AMD_OPTIONS=1 silences it",
                _state["rank"], _state["num_ranks"])


def _refuse_unknown(kwargs: dict, params, kernel: str) -> None:
    unknown = sorted(set(kwargs).difference(params).difference(known_options()))
    if unknown:
        raise KeyError(f"Keyword argument {unknown[0]} was specified but unrecognised: {kernel} has no parameter "
                       f"{unknown[0]!r} and no Triton target knows a launch option of that name "
                       f"(kernel parameters: {', '.join(params)})")


def _install_for_gpu(vendor: str) -> None:
    from triton.runtime.jit import JITFunction

    triton_run = JITFunction.__dict__.get("_iris_run_before_options", JITFunction.run)

    def run(self, *args, grid, warmup, **kwargs):
        if not AMD_ONLY.isdisjoint(kwargs):  # a set test: the common launch pays nothing more
            params = self.arg_names
            _announce(kwargs, params, vendor)
            kwargs = for_target(vendor, kwargs, params)
        return triton_run(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction._iris_run_before_options = triton_run
    JITFunction.run = run


def _install_for_interpreter() -> None:
    from triton.runtime.interpreter import GridExecutor

    # hooked after InterpretedFunction.run, so the cross-compile gate still sees the AMD options
    triton_call = GridExecutor.__dict__.get("_iris_call_before_options", GridExecutor.__call__)

    def __call__(self, *args, **kwargs):
        params = self.arg_names
        if not set(kwargs).issubset(params):
            _refuse_unknown(kwargs, params, getattr(self.fn, "__name__", "the kernel"))
            _announce(kwargs, params, "the CPU backend")
            kwargs = for_target(None, kwargs, params)
        return triton_call(self, *args, **kwargs)

    GridExecutor._iris_call_before_options = triton_call
    GridExecutor.__call__ = __call__


def install(backend, rank, num_ranks) -> None:
    """Filter launch options for ``backend`` from now on (once per process); warnings name ``rank``."""
    _state["rank"], _state["num_ranks"] = rank, num_ranks
    name = backend.name
    if _state["installed"] is not None or name == "hip":
        _state["installed"] = _state["installed"] or name
        return
    if backend.compiles_kernels:
        _install_for_gpu(name)
    else:
        _install_for_interpreter()
    _state["installed"] = name


def forget_announcements() -> None:
    """Announce each dropped option again (tests)."""
    _announced.clear()
