"""A Triton kernel launched again and again with new arguments, without Triton's per-call Python.

:func:`iris.host.replay.bind` is for a launch whose arguments never change; :class:`Relaunch` for one whose tensors
and counts change every call (the MoE dispatcher's). It keeps compiled kernels by a key at least as fine as what
Triton specializes on, so a kernel never runs with arguments it was not compiled for. On the interpreter (the CPU
backend) and under a launch hook (a profiler) a call is the plain ``kernel[grid](*args, **options)``.

Example:
    >>> pack = Relaunch(_pack_kernel, BLOCK=1024, num_warps=4)
    >>> pack((programs,), tokens, order, out, n)   # as _pack_kernel[(programs,)](tokens, ..., BLOCK=1024, ...)
"""

from __future__ import annotations

import inspect

import torch

from iris.host.replay.plans import _RUNTIME_KNOBS, _compiles, _current_stream, _no_hook

_INT32, _INT64 = 1 << 31, 1 << 63


def _key_of(value):
    """What Triton may specialize a kernel on for one argument (a superset of it)."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return bool, value
    if isinstance(value, int):
        width = 32 if -_INT32 <= value < _INT32 else 64 if -_INT64 <= value < _INT64 else 65
        return width, value == 1, value % 16 == 0
    if isinstance(value, float):
        return float
    return type(value), value  # None, a constexpr passed by position: by value


class Relaunch:
    """``kernel[grid](*args, **options)``, ``options`` (constexprs by name, launch options such as ``num_warps``)
    fixed and ``args`` new on every call, e.g. ``Relaunch(_combine_kernel, K=8, BLOCK=1024)((132,), x, out, n)``."""

    def __init__(self, kernel, **options):
        self._kernel, self._options = kernel, options
        self._launches: dict = {}  # key -> (run, function, metadata, the constexprs' values after the arguments)

    def _compile(self, grid, args):
        compiled = self._kernel.warmup(*args, grid=grid, **self._options)
        if hasattr(compiled, "result"):  # Triton's asynchronous compile mode hands back a future
            compiled = compiled.result()
        compiled.run  # noqa: B018  (loads the module: sets compiled.function)
        names = [p.name for p in self._kernel.params]
        defaults = {name: p.default for name, p in inspect.signature(self._kernel.fn).parameters.items()}
        tail = tuple(self._options[name] if name in self._options else defaults[name] for name in names[len(args):])
        return compiled.run, compiled.function, compiled.packed_metadata, tail

    def __call__(self, grid, *args) -> None:
        if not _compiles() or not _no_hook(_RUNTIME_KNOBS.launch_enter_hook):
            self._kernel[grid](*args, **self._options)
            return
        device = torch.cuda.current_device()
        key = (device, tuple(grid), *map(_key_of, args))
        launch = self._launches.get(key)
        if launch is None:
            launch = self._launches[key] = self._compile(tuple(grid), args)
        run, function, metadata, tail = launch
        values = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in args)
        grid = tuple(grid) + (1,) * (3 - len(grid))
        run(grid[0], grid[1], grid[2], _current_stream(device), function, metadata, None, None, None, *values, *tail)
