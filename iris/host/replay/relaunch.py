"""A Triton kernel launched again and again with new arguments, without Triton's per-call Python.

``kernel[grid](*args)`` binds every argument, works out what the compiler specializes on and looks the
compiled kernel up on every call: on an H200 host tens of microseconds for a kernel of fifteen arguments,
more than the GPU time of a small data mover. :func:`iris.host.replay.bind` removes it for a launch whose
arguments never change; :class:`Relaunch` is for launches whose tensors and counts change from call to call
(the MoE dispatcher's: new tokens and routing each time). It keeps the compiled kernels by a key that holds
everything Triton specializes on (each tensor's dtype and 16-byte alignment, each integer's width and whether
it is 1 or a multiple of 16, each other scalar's type and value) and launches the compiled kernel directly.
The key is at least as fine as Triton's, so a kernel is never launched with arguments it was not compiled
for: a new key only asks Triton for the kernel (compiled, or found in its caches).

On Triton's interpreter (the CPU backend), and while a Triton launch hook (a profiler) is installed, a call
is the plain ``kernel[grid](*args, **options)``.

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
    """``kernel[grid](*args, **options)`` with ``options`` (constexprs by name, launch options such as
    ``num_warps``) fixed and ``args`` new on every call; see the module's docstring.

    Args:
        kernel: a ``@triton.jit`` function.
        options: its constexpr arguments by name and launch options, the same on every call.

    Example:
        >>> combine = Relaunch(_combine_kernel, K=8, BLOCK=1024, num_warps=4)
        >>> combine((132,), returned, inverse, weights, out, tokens, hidden)
    """

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
