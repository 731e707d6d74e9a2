"""DeviceContext: the device API with the current rank implicit.

The context tensor (``ctx.get_device_context()``) is an int64 tensor laid out as
below (the slots are :mod:`iris.device.rma`'s, which finds the current rank there;
``ctx.get_heap_bases()`` is a view of its bases)::

    [RANK_SLOT] current rank
    [WORLD_SLOT] world size
    [HEAP_BASES_SLOT + r] heap base of rank r, for r in 0 .. world_size - 1

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
from iris.runtime import interpreted

RANK_SLOT, WORLD_SLOT, HEAP_BASES_SLOT = rma.RANK_SLOT, rma.WORLD_SLOT, rma.HEAP_BASES_SLOT


def build_context_tensor(rank: int, world_size: int, heap_bases: list[int], device) -> torch.Tensor:
    """The host side of the layout above."""
    bases_at = HEAP_BASES_SLOT.value
    values = [0] * (bases_at + world_size)
    values[RANK_SLOT.value] = rank
    values[WORLD_SLOT.value] = world_size
    values[bases_at : bases_at + world_size] = heap_bases
    return torch.tensor(values, dtype=torch.int64, device=device)


class _DeviceContext:
    """The device API bound to the current rank. Each method is the functional
    function of the same name in :mod:`iris.device.rma`, :mod:`iris.device.atomics`
    or :mod:`iris.device.sync` with the current rank filled in; see those for the arguments.
    """

    rank: tl.constexpr
    world_size: tl.constexpr
    heap_bases: tl.tensor

    def __init__(self, rank, world_size, heap_bases):
        self.rank = tl.constexpr(rank)
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases

    # Runs at compile time (like Triton's own aggregate constructors), not as device code.
    __init__.__triton_builtin__ = True

    @triton.jit
    def initialize(context_tensor, rank: tl.constexpr, world_size: tl.constexpr):
        """Build the context from ``ctx.get_device_context()`` inside a kernel."""
        return DeviceContext(rank, world_size, context_tensor + HEAP_BASES_SLOT)

    @triton.jit
    def translate(self, ptr, to_rank):
        return rma.translate(ptr, self.rank, to_rank, self.heap_bases)

    @triton.jit
    def load(self, pointer, from_rank, mask=None, other=None, cache_modifier=None, volatile=False):
        return rma.load(pointer, self.rank, from_rank, self.heap_bases, mask, other, cache_modifier, volatile)

    @triton.jit
    def store(self, pointer, value, to_rank, mask=None, cache_modifier=None):
        rma.store(pointer, value, self.rank, to_rank, self.heap_bases, mask, cache_modifier)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None):
        rma.get(from_ptr, to_ptr, from_rank, self.rank, self.heap_bases, mask)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None):
        rma.put(from_ptr, to_ptr, self.rank, to_rank, self.heap_bases, mask)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None):
        rma.copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask)

    @triton.jit
    def atomic_add(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        return atomics.atomic_add(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)

    @triton.jit
    def atomic_sub(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        return atomics.atomic_sub(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)

    @triton.jit
    def atomic_cas(self, pointer, cmp, val, to_rank, sem=None, scope=None):
        return atomics.atomic_cas(pointer, cmp, val, self.rank, to_rank, self.heap_bases, sem, scope)

    @triton.jit
    def atomic_xchg(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        return atomics.atomic_xchg(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)

    @triton.jit
    def atomic_xor(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        return atomics.atomic_xor(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)

    @triton.jit
    def atomic_and(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        return atomics.atomic_and(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)

    @triton.jit
    def atomic_or(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        return atomics.atomic_or(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)

    @triton.jit
    def atomic_min(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        return atomics.atomic_min(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)

    @triton.jit
    def atomic_max(self, pointer, val, to_rank, mask=None, sem=None, scope=None):
        return atomics.atomic_max(pointer, val, self.rank, to_rank, self.heap_bases, mask, sem, scope)

    @triton.jit
    def signal(self, ptr, value, to_rank, op: tl.constexpr = tl.constexpr("set"),
               sem: tl.constexpr = tl.constexpr("release"), scope: tl.constexpr = tl.constexpr("sys")):
        return sync.signal(ptr, value, self.rank, to_rank, self.heap_bases, op, sem, scope)

    @triton.jit
    def wait_until(self, ptr, cmp: tl.constexpr, value, sem: tl.constexpr = tl.constexpr("acquire"),
                   scope: tl.constexpr = tl.constexpr("sys")):
        return sync.wait_until(ptr, cmp, value, sem, scope)


DeviceContext = aggregate(_DeviceContext)


class _InterpretedMethod:
    """Triton's interpreter runs jit functions as plain callables that do not bind
    ``self``; this descriptor binds it, so ``ctx.load(...)`` works there too."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, instance, owner=None):
        return self.fn if instance is None else functools.partial(self.fn, instance)


for _name, _member in vars(_DeviceContext).items():
    if not _name.startswith("__") and callable(_member):
        if interpreted():
            setattr(DeviceContext, _name, _InterpretedMethod(_member))
        elif not hasattr(DeviceContext, _name):
            setattr(DeviceContext, _name, _member)

TritonContext = DeviceContext  # the original's earlier name for it
