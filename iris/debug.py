"""Debug mode: every device wait gives up after IRIS_WAIT_TIMEOUT seconds and the host says why.

Turn it on with IRIS_DEBUG=1 or ``iris.iris(..., debug=True)``, before the first kernel that
waits is compiled: the switch is a compile-time constant of the device code, so kernels built
without it carry no extra instruction (and Triton refuses to run a kernel compiled before the
switch changed). A wait that times out fills in one record and returns; the next
``ctx.barrier()`` (after every rank has reached it) or, in debug mode, ``ctx.device_barrier()``
raises :class:`WaitTimeoutError` naming the rank, the program, the awaited word (heap offset and
owning rank), the expected value and the last one seen.

Record layout (int64[8], one per process, never freed so its address stays constant):
    [0] kind (0 none, 1 wait_until, 2 device_barrier)   [1] program id   [2] awaited address
    [3] expected   [4] last seen   [5] comparison index (wait_until) or late rank (device_barrier)
    [6] nanoseconds waited
"""

from __future__ import annotations

import os

import torch
import triton.language as tl

from iris.device import sync

_record: torch.Tensor | None = None


class WaitTimeoutError(RuntimeError):
    """A device wait or barrier gave up in debug mode (see :mod:`iris.debug`)."""


def requested_by_environment() -> bool:
    return os.environ.get("IRIS_DEBUG", "0").strip().lower() in ("1", "true", "yes", "on")


def wait_timeout_s() -> float:
    text = os.environ.get("IRIS_WAIT_TIMEOUT", "10")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"IRIS_WAIT_TIMEOUT={text!r} must be a number of seconds") from None
    if value <= 0:
        raise ValueError(f"IRIS_WAIT_TIMEOUT={text!r} must be positive")
    return value


def enabled() -> bool:
    return bool(sync.DEBUG.value)


def enable(device: torch.device) -> None:
    """Turn debug mode on for this process (idempotent); the record lives on ``device``."""
    global _record
    if _record is None:
        _record = torch.zeros(8, dtype=torch.int64, device=device)
    sync.WAIT_TIMEOUT_NS = tl.constexpr(int(wait_timeout_s() * 1e9))
    sync.RECORD_ADDRESS = tl.constexpr(_record.data_ptr())
    sync.DEBUG = tl.constexpr(True)


def raise_if_timed_out(rank: int, heap) -> None:
    """Raise :class:`WaitTimeoutError` if a wait of this process timed out since the last check.

    Call after the device work is complete (the record is read from the host).
    """
    if _record is None:
        return
    kind, pid, address, expected, seen, detail, waited_ns, _ = _record.cpu().tolist()
    if kind == 0:
        return
    _record.zero_()
    found = heap.locate(address)
    where = f"heap offset {found[1]:#x} of rank {found[0]}" if found else f"address {address:#x} (not on the heap)"
    if kind == sync.WAIT_UNTIL_RECORD.value:
        cmp = sync.COMPARISONS[detail]
        message = (f"rank {rank} program {pid} gave up after {waited_ns / 1e9:.1f} s in wait_until: "
                   f"waiting until the word at {where} {cmp} {expected}; last saw {seen}")
    else:
        message = (f"rank {rank} program {pid} gave up after {waited_ns / 1e9:.1f} s in device_barrier: "
                   f"waiting for rank {detail} to arrive (arrival counter at {where}: expected {expected}, "
                   f"last saw {seen})")
    raise WaitTimeoutError(message + "; a signal that never came, or a rank that never reached this point")

