"""Debug mode: waits give up after IRIS_WAIT_TIMEOUT seconds, bad accesses are caught, and the host says why.

Turn it on with IRIS_DEBUG=1 or ``iris.iris(..., debug=True)``, before the first kernel that
waits is compiled: the checks are compiled into the device code only then, so a process whose
contexts never ask for debug mode runs kernels without an extra instruction (and Triton refuses
to run a kernel compiled before the switch changed). Once compiled in, each context switches its
own checks on and off at any time with ``ctx.set_debug(True/False)``: the cross-rank agreement
checks of ``ctx.ccl`` and ``ctx.ops``, the diagnosis after each collective, and the access checks
of kernels given that context's heap bases (its context tensor's debug word). Waits stay bounded
in every context of a process that compiled the checks in.

A wait that times out fills in one record and returns; the next ``ctx.barrier()`` (after every
rank has reached it) or, in debug mode, ``ctx.device_barrier()`` raises :class:`WaitTimeoutError`
naming the rank, the program, the awaited word (heap offset and owning rank), the expected value
and the last one seen.

Every ``translate`` (so every load, store, get, put, copy, atomic and signal) also checks the
lanes it will access: a rank outside the world or a pointer outside the heap is recorded, the
lane is pointed at a scratch word instead of faulting, and the host raises
:class:`DeviceAccessError` with the rank, the program, the ranks asked for and the address.

Hangs under ``iris run``: :func:`enable_stack_dumps` (called by ``iris.iris()``) lets the launcher's
timeout make every rank print its Python stacks.

Record layout (int64[16], one per process, never freed so its address stays constant; on GPUs device memory, or
with IRIS_RECORD_ON_HOST a host page at one fixed address mapped for the device):

    [0] kind (0 none, 1 wait_until, 2 device_barrier, 3 rank out of range, 4 outside the heap,
        5 a load or get naming two ranks, neither of them the current rank: [3], [4] those ranks, [5] the current)
    [1] program id   [2] address (awaited word, or the lowest bad pointer)
    [3] expected (waits) or from_rank   [4] last seen (waits) or to_rank
    [5] comparison index (wait_until), late rank (device_barrier) or world size
    [6] nanoseconds waited   [7] scratch word for redirected lanes
    [9] heap bytes per rank (the largest of this process's contexts)
"""

from __future__ import annotations

import signal

import torch
import triton.language as tl

from iris import config
from iris.device import rma, sync
from iris.runtime import get_backend

RECORD_WORDS = 16
_record: torch.Tensor | None = None
_record_address = 0  # where kernels write the record (the device's address of it)


def enable_stack_dumps() -> None:
    """Under ``iris run``, make SIGUSR1 print every thread's Python stack to stderr (called by ``iris.iris()``).

    The launcher sends SIGUSR1 to the ranks still running at its timeout, so a hang says where
    each rank waits. faulthandler writes from its signal handler, also while the rank blocks in C.
    """
    if config.stack_dumps_requested():
        import faulthandler

        faulthandler.register(signal.SIGUSR1, all_threads=True)


class WaitTimeoutError(RuntimeError):
    """A device wait or barrier gave up in debug mode (see :mod:`iris.host.debug`)."""


class DeviceAccessError(RuntimeError):
    """Debug mode caught a device access to a rank outside the world or outside the heap."""


def compiled_in() -> bool:
    """Whether this process compiles kernels with the debug checks (see the module's docstring)."""
    return bool(rma.DEBUG.value)


def waits_bounded() -> bool:
    """Whether this process compiles its device waits bounded (debug mode, or IRIS_STALL_TIMEOUT)."""
    return bool(sync.BOUNDED_WAITS.value)


def compile_flavour() -> tuple[bool, bool]:
    """(waits bounded, accesses checked): what this process compiles into kernels."""
    return waits_bounded(), compiled_in()


def _the_record(device: torch.device) -> tuple[torch.Tensor, int]:
    """(the record, as a tensor the host reads; the address kernels write it at), made once: kernels compile the
    address in. See :meth:`iris.runtime.Backend.debug_record` for where it lives."""
    global _record, _record_address
    if _record is None:
        _record, _record_address = get_backend().debug_record(device, RECORD_WORDS)
    return _record, _record_address


def enable(device: torch.device, heap_bytes: int) -> None:
    """Compile the debug checks into this process's kernels from now on (idempotent); the record lives
    on ``device``. ``heap_bytes`` (per rank, reserved tail included) bounds the checked accesses.
    """
    record, address = _the_record(device)
    record[9] = max(int(record[9]), heap_bytes)
    _set_constants(True, True, address, config.wait_timeout_s())


def bound_waits(device: torch.device, timeout_s: float) -> None:
    """Outside debug mode: compile every device wait of this process bounded by ``timeout_s`` from now on (a wait
    that gives up fills in the record and returns; :mod:`iris.host.watchdog` ends the rank with it). Nothing
    where the waits are bounded already (debug mode's own bound stays)."""
    if not waits_bounded():
        _set_constants(True, compiled_in(), _the_record(device)[1], timeout_s)


def _set_constants(waits: bool, checks: bool, record_address: int, timeout_s: float) -> None:
    sync.WAIT_TIMEOUT_NS = tl.constexpr(int(timeout_s * 1e9))
    rma.RECORD_ADDRESS = tl.constexpr(record_address if waits or checks else 0)
    rma.DEBUG = tl.constexpr(checks)
    sync.BOUNDED_WAITS = tl.constexpr(waits)


def set_compile_constants(flavour: bool | tuple[bool, bool]) -> None:
    """In a cross-compile worker (iris.testing.cross_compile): compile kernels as this flavour
    (:func:`compile_flavour`; True: debug mode's, both). Nothing launches there, so the record's address is a
    placeholder."""
    waits, checks = (flavour, flavour) if isinstance(flavour, bool) else flavour
    _set_constants(waits, checks, 1 << 20, config.wait_timeout_s())


def raise_if_reported(rank: int, heap) -> None:
    """Raise what a device check of this process reported since the last call, if anything.

    Call after the device work is complete (the record is read from the host).

    Raises:
        WaitTimeoutError: a wait_until or device_barrier gave up.
        DeviceAccessError: an access named a rank outside the world or a pointer outside the heap.
    """
    report = take_report(rank, heap)
    if report is not None:
        raise report


def take_report(rank: int, heap, words: list[int] | None = None) -> Exception | None:
    """What a device check of this process reported since the last take, as the exception to raise (the record
    cleared), or None. ``words``: the record's first seven words, read by the caller (the watchdog reads them on
    a stream of its own); else read here, after the device work is complete."""
    if _record is None:
        return None
    kind, pid, address, expected, seen, detail, waited_ns = words or _record[:7].cpu().tolist()
    if kind == 0:
        return None
    _record[:8].zero_()
    found = heap.locate(address)
    where = f"heap offset {found[1]:#x} of rank {found[0]}" if found else f"address {address:#x} (not on the heap)"
    if kind == rma.RANK_OUT_OF_RANGE_RECORD.value:
        return DeviceAccessError(f"rank {rank} program {pid}: an access from rank {expected} to rank {seen} in a "
                                 f"world of {detail} ranks (valid ranks are 0..{detail - 1}); pointer {where}")
    if kind == rma.NOT_THE_CURRENT_RANK_RECORD.value:
        return DeviceAccessError(f"rank {rank} program {pid}: a load or get named ranks {expected} and {seen}, neither "
                                 f"of them the current rank {detail}; its pointer is local to the current rank, so one "
                                 "of the two ranks must be the current one (the other is read)")
    if kind == rma.OUTSIDE_HEAP_RECORD.value:
        return DeviceAccessError(f"rank {rank} program {pid}: pointer {address:#x} is outside the heap of rank "
                                 f"{expected} (an access from rank {expected} to rank {seen}); pass tensors made "
                                 "by the context (ctx.zeros, ctx.empty, ...) or ctx.as_symmetric(...)")
    if kind == sync.WAIT_UNTIL_RECORD.value:
        cmp = sync.COMPARISONS[detail]
        message = (f"rank {rank} program {pid} gave up after {waited_ns / 1e9:.1f} s in wait_until: "
                   f"waiting until the word at {where} {cmp} {expected}; last saw {seen}")
    else:
        message = (f"rank {rank} program {pid} gave up after {waited_ns / 1e9:.1f} s in device_barrier: "
                   f"waiting for rank {detail} to arrive (arrival counter at {where}: expected {expected}, "
                   f"last saw {seen})")
    return WaitTimeoutError(message + "; a signal that never came, or a rank that never reached this point")

