"""DeviceContext: the device API with the current rank implicit.

The context tensor (``ctx.get_device_context()``) is an int64 tensor laid out as
below (the slots are :mod:`iris.device.rma`'s, which finds the current rank there;
``ctx.get_heap_bases()`` is a view of its bases)::

    [RANK_SLOT] current rank
    [WORLD_SLOT] world size
    [HEAP_BASES_SLOT + r] heap base of rank r, for r in 0 .. world_size - 1
    [HEAP_BASES_SLOT + world_size ...] the tracing fields (iris.device.tracing)

and, past the tensor in the same memory, the context's debug word (1: checks on; read only by kernels
compiled in debug mode; see iris.device.rma.DEBUG), then the address of the heap's engine scratch word
(read only by kernels of a job across nodes; see iris.device.nvshmem).

Example:
    >>> @triton.jit
    ... def kernel(context, buf, rank: tl.constexpr, world_size: tl.constexpr):
    ...     ctx = iris.DeviceContext.initialize(context, rank, world_size)
    ...     offs = tl.arange(0, 64)
    ...     ctx.store(buf + offs, offs, to_rank=(rank + 1) % world_size)
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.core import _aggregate as aggregate

from iris.device import atomics, rma, sync
from iris.device import tracing as trace
from iris.device.tracing import DeviceTracing, _DeviceTracing, payload_bytes, tracing_from_context
from iris.runtime import device_facts

RANK_SLOT, WORLD_SLOT, HEAP_BASES_SLOT = rma.RANK_SLOT, rma.WORLD_SLOT, rma.HEAP_BASES_SLOT


def build_context_tensor(rank: int, world_size: int, heap_bases: list[int], device,
                         engine_scratch: int = 0) -> torch.Tensor:
    """The host side of the layout above, with the tracing fields after the bases (zeros: tracing off;
    see iris.device.tracing), then the debug word (0) and the engine scratch word's address: the context
    tensor is this without its last two words."""
    bases_at = HEAP_BASES_SLOT.value
    values = [0] * (trace.context_length(world_size) + 2)
    values[-1] = engine_scratch
    values[RANK_SLOT.value] = rank
    values[WORLD_SLOT.value] = world_size
    values[bases_at : bases_at + world_size] = heap_bases
    return torch.tensor(values, dtype=torch.int64, device=device)


class _DeviceContext:
    """The device API bound to the current rank. Each method is the functional
    function of the same name in :mod:`iris.device.rma`, :mod:`iris.device.atomics`
    or :mod:`iris.device.sync` with the current rank filled in; see those for the arguments.

    Built with ``tracing=True`` (and ``ctx.tracing.enable()`` on the host), every method also
    records an event (see :mod:`iris.device.tracing`); built without, none adds an instruction.
    """

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing

    def __init__(self, rank, world_size, heap_bases, tracing):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases
        self.tracing = tracing

    # Runs at compile time (like Triton's own aggregate constructors), not as device code.
    __init__.__triton_builtin__ = True

    @triton.jit
    def initialize(context_tensor, rank: tl.constexpr, world_size: tl.constexpr, tracing: tl.constexpr = False):
        """Build the context from ``ctx.get_device_context()`` inside a kernel; ``tracing``: record events."""
        return DeviceContext(rank, world_size, context_tensor + HEAP_BASES_SLOT,
                             tracing_from_context(context_tensor, world_size, tracing))

    @triton.jit
    def _begin(self, event: tl.constexpr, target_rank, pointer, mask):
        slot = tl.full((), -1, tl.int64)
        if self.tracing.enabled:  # a constexpr: without tracing, not even the payload is computed
            slot = self.tracing.start(event, self.rank, target_rank, pointer, tl.program_id(0), tl.program_id(1),
                                      payload_bytes(pointer, mask))
        return slot

    @triton.jit
    def record_event_start(self, event_id: tl.constexpr, target_rank, address, pid_m, pid_n):
        """Start a traced span of your own (``iris.TraceEvent().compute``, ...); returns its handle."""
        return self.tracing.start(event_id, self.rank, target_rank, address, pid_m, pid_n, 0)

    @triton.jit
    def record_event_end(self, handle):
        """End the span ``record_event_start`` returned ``handle`` for."""
        self.tracing.end(handle)

    @triton.jit
    def record_event(self, event_id: tl.constexpr, target_rank, address, pid_m=0, pid_n=0):
        """Record an instant event of your own."""
        self.tracing.start(event_id, self.rank, target_rank, address, pid_m, pid_n, 0)

    @triton.jit
    def translate(self, ptr, to_rank):
        return rma.translate(ptr, self.rank, to_rank, self.heap_bases)

    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier=None, volatile=False):
        event = self._begin(trace.LOAD, from_rank, pointer, mask)
        result = rma.load(pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile)
        self.tracing.end(event)
        return result

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier=None):
        event = self._begin(trace.STORE, to_rank, pointer, mask)
        rma.store(pointer, value, self.rank, to_rank, self.heap_bases, mask, cache_modifier)
        self.tracing.end(event)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, load_cache_modifier=None, store_cache_modifier=None):
        event = self._begin(trace.GET, from_rank, from_ptr, mask)
        rma.get(from_ptr, to_ptr, from_rank, self.rank, self.heap_bases, mask, load_cache_modifier,
                store_cache_modifier)
        self.tracing.end(event)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, load_cache_modifier=None, store_cache_modifier=None):
        event = self._begin(trace.PUT, to_rank, to_ptr, mask)
        rma.put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases, mask, load_cache_modifier,
                store_cache_modifier)
        self.tracing.end(event)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, load_cache_modifier=None,
             store_cache_modifier=None):
        event = self._begin(trace.COPY, to_rank, dst_ptr, mask)
        rma.copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask, load_cache_modifier,
                 store_cache_modifier)
        self.tracing.end(event)

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_ADD, to_rank, pointer, mask)
        old = atomics.atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_SUB, to_rank, pointer, mask)
        old = atomics.atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_XCHG, to_rank, pointer, mask)
        old = atomics.atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_XOR, to_rank, pointer, mask)
        old = atomics.atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_AND, to_rank, pointer, mask)
        old = atomics.atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_OR, to_rank, pointer, mask)
        old = atomics.atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_MIN, to_rank, pointer, mask)
        old = atomics.atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_MAX, to_rank, pointer, mask)
        old = atomics.atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem=None, scope=None):
        event = self._begin(trace.ATOMIC_CAS, to_rank, pointer, None)
        old = atomics.atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def signal(self, ptr, value, to_rank, op: tl.constexpr = tl.constexpr("set"),
               sem: tl.constexpr = tl.constexpr("release"), scope: tl.constexpr = tl.constexpr("sys")):
        event = self._begin(trace.SIGNAL, to_rank, ptr, None)
        old = sync.signal(ptr, value, self.rank, to_rank, self.heap_bases, op, sem, scope)
        self.tracing.end(event)
        return old

    @triton.jit
    def wait_until(self, ptr, cmp: tl.constexpr, value, sem: tl.constexpr = tl.constexpr("acquire"),
                   scope: tl.constexpr = tl.constexpr("sys")):
        event = self._begin(trace.WAIT, self.rank, ptr, None)
        seen = sync.wait_until(ptr, cmp, value, sem, scope)
        self.tracing.end(event)
        return seen


DeviceContext = aggregate(_DeviceContext)


class _InterpretedMethod:
    """Triton's interpreter runs jit functions as plain callables that do not bind
    ``self``; this descriptor binds it, so ``ctx.load(...)`` works there too."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, instance, owner=None):
        return self.fn if instance is None else functools.partial(self.fn, instance)


def bind_methods(aggregate_class, source_class) -> None:
    """Give the aggregate its source class's jit methods (bound by hand where jit functions run as Python)."""
    as_python = not device_facts().compiles_kernels
    for name, member in vars(source_class).items():
        if not name.startswith("__") and callable(member):
            if as_python:
                setattr(aggregate_class, name, _InterpretedMethod(member))
            elif not hasattr(aggregate_class, name):
                setattr(aggregate_class, name, member)


bind_methods(DeviceContext, _DeviceContext)
bind_methods(DeviceTracing, _DeviceTracing)

TritonContext = DeviceContext  # an earlier name, kept for code that uses it
