"""The functional device ops under the original's newest path (``iris.mem.triton.ops``): ``iris.load``,
``iris.store``, ``iris.get``, ``iris.put``, ``iris.copy`` and ``iris.atomic_*`` themselves (see
:mod:`iris.device.rma` and :mod:`iris.device.atomics`).

Example:
    >>> from iris.mem.triton.ops import load
    >>> load is iris.load
    True
"""

from iris.device import (
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

__all__ = ["atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub",
           "atomic_xchg", "atomic_xor", "copy", "get", "load", "put", "store"]
