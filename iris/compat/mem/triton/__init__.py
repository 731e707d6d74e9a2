"""Triton device API under the original's newest path (``iris.mem.triton``): the same objects as ``iris.*``.

Example:
    >>> from iris.mem.triton import Context, load, store
    >>> Context is iris.DeviceContext
    True
"""

from iris.compat.mem.triton.context import Context, DeviceContext, DeviceTracing, Tracing
from iris.compat.mem.triton.ops import (
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
    copy,
    get,
    load,
    put,
    store,
)

__all__ = [
    "Context", "DeviceContext", "DeviceTracing", "Tracing", "atomic_add", "atomic_and", "atomic_cas", "atomic_max",
    "atomic_min", "atomic_or", "atomic_sub", "atomic_xchg", "atomic_xor", "copy", "get", "load", "put", "store",
]
