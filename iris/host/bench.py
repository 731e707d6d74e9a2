"""Timing code every rank runs in step: ``iris.do_bench``, and ``iris.memset_tensor``.

:func:`do_bench` runs ``fn`` once, warms it up, then times ``n_repeat`` runs, each after the
``barrier_fn`` / ``preamble_fn`` hooks and a cache flush, so every rank starts each run together
and from a cold cache. Times are in milliseconds: device time between two CUDA/HIP events on a
GPU, host time (``time.perf_counter``) on the CPU backend, where kernels run synchronously under
Triton's interpreter.

Example:
    >>> ctx = iris.iris(1 << 30)
    >>> ms = iris.do_bench(lambda: kernel[grid](...), barrier_fn=ctx.barrier)
    >>> p50, p90 = iris.do_bench(run, ctx.barrier, quantiles=[0.5, 0.9])
"""

from __future__ import annotations

import math
import numbers
import statistics
import time
from typing import Callable

import torch

from iris import runtime

RETURN_MODES = ("mean", "min", "max", "median", "all")
#: Bytes written between timed runs to evict the last run's data: the 256 MiB of an MI300X's
#: Infinity Cache (more than an H100/H200's L2) on a GPU, more than a server CPU's L3 on the CPU backend.
FLUSH_BYTES = {"gpu": 256 << 20, "cpu": 32 << 20}


def _nothing() -> None:
    return None


def _quantiles(times: list[float], quantiles) -> list[float]:
    """Linear interpolation between the closest ranks, as numpy's default does."""
    ordered = sorted(times)
    last = len(ordered) - 1
    found = []
    for q in quantiles:
        point = q * last
        low, high = math.floor(point), math.ceil(point)
        found.append(ordered[low] + (ordered[high] - ordered[low]) * (point - low))
    return found


def _check(fn, barrier_fn, preamble_fn, n_warmup, n_repeat, quantiles, return_mode) -> None:
    for name, hook in (("fn", fn), ("barrier_fn", barrier_fn), ("preamble_fn", preamble_fn)):
        if not callable(hook):
            raise TypeError(f"do_bench: {name}={hook!r} is not callable; pass a function taking no arguments")
    for name, value, least in (("n_warmup", n_warmup, 0), ("n_repeat", n_repeat, 1)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
            raise ValueError(f"do_bench: {name}={value!r} must be an integer >= {least}")
    if return_mode not in RETURN_MODES:
        raise ValueError(f"do_bench: return_mode={return_mode!r} is not one of {', '.join(RETURN_MODES)}")
    if quantiles is not None:
        if isinstance(quantiles, (str, bytes)) or not hasattr(quantiles, "__iter__"):
            raise TypeError(f"do_bench: quantiles={quantiles!r} must be a list of numbers in [0, 1]")
        bad = [q for q in quantiles if isinstance(q, bool) or not isinstance(q, numbers.Real) or not 0 <= q <= 1]
        if bad or not list(quantiles):
            raise ValueError(f"do_bench: quantiles={list(quantiles)!r} must be numbers in [0, 1] (bad: {bad})")


class _HostTimer:
    """Host wall time around each run (the CPU backend: a launch returns when the kernel is done)."""

    def __init__(self, n: int):
        self.starts, self.ends = [0.0] * n, [0.0] * n

    def start(self, i: int) -> None:
        self.starts[i] = time.perf_counter()

    def end(self, i: int) -> None:
        self.ends[i] = time.perf_counter()

    def milliseconds(self) -> list[float]:
        return [(e - s) * 1e3 for s, e in zip(self.starts, self.ends)]


class _EventTimer:
    """CUDA/HIP events on the current stream around each run: device time, not launch time."""

    def __init__(self, n: int):
        self.starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        self.ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]

    def start(self, i: int) -> None:
        self.starts[i].record()

    def end(self, i: int) -> None:
        self.ends[i].record()

    def milliseconds(self) -> list[float]:
        torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(self.starts, self.ends)]


def do_bench(fn: Callable[[], object], barrier_fn: Callable[[], object] = _nothing,
             preamble_fn: Callable[[], object] = _nothing, n_warmup: int = 25, n_repeat: int = 100,
             quantiles=None, return_mode: str = "mean"):
    """Time ``fn`` in milliseconds, every rank in step.

    ``fn`` runs once untimed, then ``n_warmup`` times untimed, then ``n_repeat`` times timed. Before
    each of these runs: ``barrier_fn()``, ``preamble_fn()`` (reset what ``fn`` consumes, e.g. zero
    its flags), a cache flush, ``barrier_fn()`` again. Pass ``ctx.barrier`` as ``barrier_fn`` in a
    job of several ranks so that every rank's run starts together.

    Args:
        fn: the work to time, a function of no arguments (it launches kernels, typically).
        barrier_fn: called around each run to line the ranks up; default: nothing.
        preamble_fn: called before each run, untimed; default: nothing.
        n_warmup: untimed runs after the first (default 25).
        n_repeat: timed runs (default 100).
        quantiles: numbers in [0, 1]; if given, return these quantiles of the times (a list, or a
            single float for a single quantile) instead of ``return_mode``'s statistic.
        return_mode: ``"mean"`` (default), ``"min"``, ``"max"``, ``"median"``, or ``"all"`` (the list of times).

    Returns:
        float | list[float]: milliseconds per run: CUDA/HIP event time on a GPU, host
        ``time.perf_counter`` time on the CPU backend.

    Raises:
        TypeError, ValueError: a hook that is not callable, a count, quantile or mode out of range
            (before anything runs).

    Example:
        >>> ms = iris.do_bench(lambda: ctx.ccl.all_reduce(out, x), barrier_fn=ctx.barrier)
        >>> times = iris.do_bench(step, ctx.barrier, reset_flags, n_warmup=5, n_repeat=20, return_mode="all")
    """
    _check(fn, barrier_fn, preamble_fn, n_warmup, n_repeat, quantiles, return_mode)
    on_gpu = runtime.get_backend().has_streams  # device events time the work
    barrier_fn()
    preamble_fn()
    fn()
    barrier_fn()
    flush_bytes = FLUSH_BYTES["gpu" if on_gpu else "cpu"]
    flush = torch.empty(flush_bytes // 4, dtype=torch.int32, device="cuda" if on_gpu else "cpu")
    timer = _EventTimer(n_repeat) if on_gpu else _HostTimer(n_repeat)
    for i in range(n_warmup + n_repeat):
        barrier_fn()
        preamble_fn()
        flush.zero_()
        barrier_fn()
        timed = i - n_warmup
        if timed >= 0:
            timer.start(timed)
        fn()
        if timed >= 0:
            timer.end(timed)
    barrier_fn()
    times = timer.milliseconds()
    if quantiles is not None:
        found = _quantiles(times, list(quantiles))
        return found[0] if len(found) == 1 else found
    if return_mode == "all":
        return times
    return {"mean": statistics.mean, "min": min, "max": max, "median": statistics.median}[return_mode](times)


def memset_tensor(tensor: torch.Tensor, value) -> torch.Tensor:
    """Fill ``tensor`` (any tensor) with ``value`` (any value its dtype holds) in stream order.

    Args:
        tensor: the tensor to fill (on the heap or not).
        value: a Python number (or bool) that ``tensor``'s dtype can hold.

    Returns:
        torch.Tensor: ``tensor``, filled.

    Raises:
        TypeError: ``tensor`` is not a tensor or ``value`` is not a number.

    Example:
        >>> flags = ctx.zeros(64, dtype=torch.int32)
        >>> iris.memset_tensor(flags, 0)   # reset the flags between two timed runs
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"memset_tensor: tensor={tensor!r} is not a torch.Tensor")
    if not isinstance(value, numbers.Number):
        raise TypeError(f"memset_tensor: value={value!r} is not a number")
    return tensor.fill_(value)
