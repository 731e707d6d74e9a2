"""AMD-only launch options on the other targets: dropped with one warning per name, kept on AMD.

The original's kernels are launched with options only Triton's AMD backend knows::

    kernel[grid](..., num_warps=8, num_stages=2, waves_per_eu=2, matrix_instr_nonkdim=16, kpack=2)

Triton's NVIDIA backend refuses them (``KeyError: 'Keyword argument waves_per_eu was specified but
unrecognised'``, raised by ``JITFunction._pack_args`` in triton/runtime/jit.py once
``CUDABackend.parse_options`` has kept only the options it knows), and Triton's interpreter drops
every keyword that is not a kernel parameter without a word, an unknown one too
(``GridExecutor.__call__`` in triton/runtime/interpreter.py). Here, in this one place:

- on AMD (HIP) every option reaches Triton unchanged;
- on NVIDIA (CUDA) and on the CPU backend (the interpreter), the options in :data:`AMD_ONLY` are
  dropped before Triton sees them, unless the kernel has a parameter of that name; each name is
  announced once per process by a warning line of the ``iris`` logger (IRIS_QUIET_AMD_OPTIONS=1
  silences it);
- on the CPU backend, an option that no target knows (neither Triton's NVIDIA nor its AMD
  backend) and that is no kernel parameter is an error, as it is on a GPU;
- Triton's behaviour for every option it knows is unchanged.

The filter is installed by the first ``iris.iris(...)`` (:func:`install`), not at ``import iris``,
which changes nothing outside iris but the interpreter switch. The cross-compile gate
(:mod:`iris.testing.cross_compile`) applies :func:`for_target` per target: a kernel compiles for
gfx942 with the options and for sm_90 without them.

Example:
    >>> ctx = iris.iris(1 << 30)
    >>> kernel[grid](x, n, BLOCK=1024, waves_per_eu=2, kpack=2)   # runs on NVIDIA, AMD and the CPU
    [Iris] [0/2] launch option waves_per_eu=2 ignored: only AMD GPUs know it (this is cuda) ...
"""

from __future__ import annotations

import functools

from iris import config
from iris.runtime.logging import WARNING, log

#: Options of Triton's AMD backend that its NVIDIA backend lacks, as the original's kernels pass them
#: (``instruction_sched_variant``: the name of ``schedule_hint`` before Triton 3.4).
AMD_ONLY = frozenset({"waves_per_eu", "matrix_instr_nonkdim", "kpack", "schedule_hint",
                      "instruction_sched_variant"})

_state = {"installed": None, "rank": "?", "num_ranks": "?"}
_announced: set[str] = set()


@functools.lru_cache(maxsize=None)
def known_options() -> frozenset:
    """Every launch option some target knows: the option fields of Triton's NVIDIA and AMD backends,
    an autotuning config's reserved keywords, and :data:`AMD_ONLY`."""
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
    """The launch keywords ``kwargs`` as a target of ``vendor`` takes them.

    Args:
        vendor: ``"hip"`` (everything kept), ``"cuda"`` or None (the interpreter): :data:`AMD_ONLY`
            options dropped.
        kwargs: the launch's keyword arguments (kernel arguments and options).
        params: the kernel's parameter names (an option of the same name is a kernel argument, kept).

    Returns:
        dict: ``kwargs`` itself when nothing is dropped, else a filtered copy.

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

    original = JITFunction.__dict__.get("_iris_run_before_options", JITFunction.run)

    def run(self, *args, grid, warmup, **kwargs):
        if not AMD_ONLY.isdisjoint(kwargs):  # a set test: the common launch pays nothing more
            params = self.arg_names
            _announce(kwargs, params, vendor)
            kwargs = for_target(vendor, kwargs, params)
        return original(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction._iris_run_before_options = original
    JITFunction.run = run


def _install_for_interpreter() -> None:
    from triton.runtime.interpreter import GridExecutor

    # GridExecutor runs each interpreted launch after InterpretedFunction.run, where the cross-compile gate
    # sits: the gate still sees the AMD options (and compiles gfx942 with them).
    original = GridExecutor.__dict__.get("_iris_call_before_options", GridExecutor.__call__)

    def __call__(self, *args, **kwargs):
        params = self.arg_names
        if not set(kwargs).issubset(params):
            _refuse_unknown(kwargs, params, getattr(self.fn, "__name__", "the kernel"))
            _announce(kwargs, params, "the CPU backend")
            kwargs = for_target(None, kwargs, params)
        return original(self, *args, **kwargs)

    GridExecutor._iris_call_before_options = original
    GridExecutor.__call__ = __call__


def install(backend: str, rank, num_ranks) -> None:
    """Filter launch options for ``backend`` ("cuda", "hip" or "cpu") from now on; warnings name ``rank``.

    Called by every ``iris.iris(...)``; installs once per process (the backend does not change).
    """
    _state["rank"], _state["num_ranks"] = rank, num_ranks
    if _state["installed"] is not None or backend == "hip":
        _state["installed"] = _state["installed"] or backend
        return
    if backend == "cpu":
        _install_for_interpreter()
    else:
        _install_for_gpu(backend)
    _state["installed"] = backend


def forget_announcements() -> None:
    """Announce each dropped option again (tests)."""
    _announced.clear()
