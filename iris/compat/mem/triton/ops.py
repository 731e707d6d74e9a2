"""The functional device ops under the original's newest path (``iris.mem.triton.ops``): ``iris.load``,
``iris.store``, ``iris.get``, ``iris.put``, ``iris.copy`` and ``iris.atomic_*`` themselves.

Example:
    >>> from iris.mem.triton.ops import load
    >>> load is iris.load
    True
"""

from iris import device

#: The device ops (no classes, no rank query): a subset of ``iris.device.__all__``.
__all__ = [name for name in device.__all__ if name[0].islower() and name not in ("current_rank", "signal",
                                                                                  "wait_until")]
globals().update({name: getattr(device, name) for name in __all__})
