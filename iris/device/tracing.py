"""Device-side tracing: the records a kernel writes when built with ``DeviceContext.initialize(..., tracing=True)``.

The host side is :mod:`iris.host.tracing` (``ctx.tracing.enable()``, ``export()``). The context tensor
carries, after the heap bases::

    [TRACE_SLOT + 0] tracing enabled (0 or 1)     [TRACE_SLOT + 1] max_events
    [TRACE_SLOT + 2] address of the event counter  [TRACE_SLOT + 3] address of the op counter
    [TRACE_SLOT + 4 + f] address of field f's buffer, for the FIELDS below

with ``TRACE_SLOT = HEAP_BASES_SLOT + world_size``; events past ``max_events`` are counted, not stored.
Tracing is a compile-time constant, so a kernel built without it compiles to the untraced code.

Example:
    >>> @triton.jit
    ... def kernel(context, buf, rank: tl.constexpr, world: tl.constexpr):
    ...     ctx = iris.DeviceContext.initialize(context, rank, world, tracing=True)
    ...     handle = ctx.record_event_start(iris.TraceEvent().compute, rank, buf, 0, 0)
    ...     ...  # the traced work
    ...     ctx.record_event_end(handle)
"""

import triton
import triton.language as tl
from triton.language.core import _aggregate as aggregate

from iris.device.rma import AMDGCN, CHECKS_AFTER_BASES, HEAP_BASES_SLOT, PTX
from iris.device.sync import _clock_ns

# Per event, one int64 each, in the context tensor's order; ``end`` is 0 for an instant.
FIELDS = ("event_id", "pid", "pid_m", "pid_n", "cur_rank", "target_rank", "xcc_id", "cu_id", "timestamp",
          "address", "end", "op_index", "payload_size")
HEADER = 4  # enabled, max_events, event counter, op counter (op_index is the event's slot)


def header_slot(world_size: int) -> int:
    """Where the tracing fields start in the context tensor of ``world_size`` ranks."""
    return HEAP_BASES_SLOT.value + world_size


def context_length(world_size: int) -> int:
    """The context tensor's length: rank, world, bases, the tracing header and one address per field."""
    return header_slot(world_size) + HEADER + len(FIELDS)


assert HEADER + len(FIELDS) == CHECKS_AFTER_BASES.value, "the debug word follows the context tensor"
# Each field's row in the records (its place in FIELDS); the unpacking fails if the two disagree.
(F_EVENT_ID, F_PID, F_PID_M, F_PID_N, F_CUR_RANK, F_TARGET_RANK, F_XCC_ID, F_CU_ID, F_TIMESTAMP, F_ADDRESS, F_END,
 F_OP_INDEX, F_PAYLOAD_SIZE) = (tl.constexpr(row) for row in range(len(FIELDS)))

# Event kinds (0- Iris ops, 1024- data movement, 2048- compute, 3072- synchronization), each also a
# constexpr of this module: tracing.PUT, ...
EVENT_NAMES = {
    0: "load", 1: "store", 2: "get", 3: "put", 4: "copy", 5: "atomic_add", 6: "atomic_sub", 7: "atomic_cas",
    8: "atomic_xchg", 9: "atomic_xor", 10: "atomic_and", 11: "atomic_or", 12: "atomic_min", 13: "atomic_max",
    14: "wg_fetch", 15: "wg_gemm", 16: "wg_gemm_wait", 17: "wg_sdma", 18: "signal",
    1024: "fetch", 2048: "compute", 2049: "reduce", 3072: "wait", 3073: "barrier",
}
for _number, _name in EVENT_NAMES.items():
    globals()[_name.upper()] = tl.constexpr(_number)


class _TraceEvent:
    """The event kinds as constexprs, for ``record_event*``: ``iris.TraceEvent().compute``."""

    load: tl.constexpr
    store: tl.constexpr
    get: tl.constexpr
    put: tl.constexpr
    copy: tl.constexpr
    atomic_add: tl.constexpr
    atomic_sub: tl.constexpr
    atomic_cas: tl.constexpr
    atomic_xchg: tl.constexpr
    atomic_xor: tl.constexpr
    atomic_and: tl.constexpr
    atomic_or: tl.constexpr
    atomic_min: tl.constexpr
    atomic_max: tl.constexpr
    wg_fetch: tl.constexpr
    wg_gemm: tl.constexpr
    wg_gemm_wait: tl.constexpr
    wg_sdma: tl.constexpr
    signal: tl.constexpr
    fetch: tl.constexpr
    compute: tl.constexpr
    reduce: tl.constexpr
    wait: tl.constexpr
    barrier: tl.constexpr

    def __init__(self):
        for number, name in EVENT_NAMES.items():
            setattr(self, name, tl.constexpr(number))

    __init__.__triton_builtin__ = True


TraceEvent = aggregate(_TraceEvent)


@triton.jit
def _core_id():
    """The SM or compute unit this program runs on; 0 under Triton's interpreter."""
    if AMDGCN:
        hw = tl.inline_asm_elementwise("s_getreg_b32 $0, hwreg(HW_REG_HW_ID)", "=s", [], dtype=tl.int32,
                                       is_pure=False, pack=1)
        core = ((hw >> 13) & 0x7) * 16 + ((hw >> 8) & 0xF)  # SE_ID * 16 + CU_ID
    elif PTX:
        core = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
    else:
        core = tl.full((), 0, tl.int32)
    return core


@triton.jit
def _xcc_id():
    """The accelerator die (AMD XCC) this program runs on; 0 elsewhere."""
    if AMDGCN:
        xcc = tl.inline_asm_elementwise("s_getreg_b32 $0, hwreg(HW_REG_XCC_ID)", "=s", [], dtype=tl.int32,
                                        is_pure=False, pack=1) & 0xF
    else:
        xcc = tl.full((), 0, tl.int32)
    return xcc


class _DeviceTracing:
    """Where a kernel's events go (made by ``DeviceContext.initialize``; see the module)."""

    enabled: tl.constexpr
    max_events: tl.tensor
    counter: tl.tensor
    records: tl.tensor

    def __init__(self, enabled, max_events, counter, records):
        self.enabled = tl.constexpr(enabled)
        self.max_events = max_events
        self.counter = counter
        self.records = records

    __init__.__triton_builtin__ = True

    @triton.jit
    def start(self, event_id: tl.constexpr, cur_rank, target_rank, address, pid_m, pid_n, payload_bytes):
        """Record an event's start; returns its slot for :meth:`end` (-1 when nothing is recorded)."""
        slot = tl.full((), -1, tl.int64)
        if self.enabled:
            if self.max_events > 0:  # 0 while the host has not enabled tracing: the counter is not there yet
                slot = tl.atomic_add(self.counter, 1).to(tl.int64)
            if (slot >= 0) & (slot < self.max_events):
                fields = self.records
                stride = self.max_events
                tl.store(fields + F_EVENT_ID * stride + slot, event_id)
                tl.store(fields + F_PID * stride + slot, tl.program_id(0))
                tl.store(fields + F_PID_M * stride + slot, pid_m)
                tl.store(fields + F_PID_N * stride + slot, pid_n)
                tl.store(fields + F_CUR_RANK * stride + slot, cur_rank)
                tl.store(fields + F_TARGET_RANK * stride + slot, target_rank)
                tl.store(fields + F_XCC_ID * stride + slot, _xcc_id())
                tl.store(fields + F_CU_ID * stride + slot, _core_id())
                tl.store(fields + F_ADDRESS * stride + slot, tl.min(address.to(tl.int64) + tl.zeros([1], tl.int64)))
                tl.store(fields + F_END * stride + slot, 0)
                tl.store(fields + F_OP_INDEX * stride + slot, slot)
                tl.store(fields + F_PAYLOAD_SIZE * stride + slot, payload_bytes)
                tl.store(fields + F_TIMESTAMP * stride + slot, _clock_ns())  # last: closest to the op
            else:
                slot = tl.full((), -1, tl.int64)
        return slot

    @triton.jit
    def end(self, slot):
        """Record the end of the event ``start`` returned ``slot`` for."""
        if self.enabled:
            if slot >= 0:
                tl.store(self.records + F_END * self.max_events + slot, _clock_ns())


DeviceTracing = aggregate(_DeviceTracing)


@triton.jit
def elements_bytes(pointer, elements):
    """Bytes of ``elements`` elements of ``pointer``'s type (a span's payload)."""
    return elements * (pointer.dtype.element_ty.primitive_bitwidth // 8)


@triton.jit
def payload_bytes(pointer, mask):
    """Bytes an access of ``pointer`` moves: its selected lanes times the element size."""
    elem_bytes: tl.constexpr = pointer.dtype.element_ty.primitive_bitwidth // 8
    lanes = pointer.to(tl.int64)
    if mask is None:
        selected = lanes == lanes
    else:
        selected = mask & (lanes == lanes)
    return tl.sum((selected | tl.zeros([1], tl.int1)).to(tl.int64)) * elem_bytes


@triton.jit
def tracing_from_context(context_tensor, world_size: tl.constexpr, tracing: tl.constexpr):
    """The :class:`DeviceTracing` of a context tensor (disabled at compile time unless ``tracing``)."""
    header = context_tensor + HEAP_BASES_SLOT + world_size
    if tracing:
        result = DeviceTracing(True, tl.load(header + 1), tl.load(header + 2).to(tl.pointer_type(tl.int32)),
                               tl.load(header + 4).to(tl.pointer_type(tl.int64)))
    else:
        result = DeviceTracing(False, tl.full((), 0, tl.int64), context_tensor, context_tensor)
    return result
