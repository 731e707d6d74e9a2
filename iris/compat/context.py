"""The original's names on the host context, bound onto :class:`iris.Iris` by :func:`install`, each one adapted
onto the native API; besides these functions, ``ctx.device`` is :meth:`~iris.Iris.get_device` as a string
and ``ctx._Iris__allocate`` is :func:`allocate`.

Example:
    >>> ctx.log_stats(f"bandwidth {gbps:.1f} GB/s")      # ctx.info(...)
    >>> ctx.device                                       # "cuda:0"
"""

from __future__ import annotations

import math
import numbers

import torch

from iris import context
from iris.device.context import DeviceContext
from iris.memory.tensors import normalize_size


def log(self, message: str) -> None:
    """:meth:`iris.Iris.info`: ``ctx.log(f"validated {n} elements")``."""
    self.info(message)


def log_debug(self, message: str) -> None:
    """:meth:`iris.Iris.debug`: ``ctx.log_debug(f"heap at {hex(ctx.heap.base)}")``."""
    self.debug(message)


def log_stats(self, message: str) -> None:
    """A measurement at info level (:meth:`iris.Iris.info`): ``ctx.log_stats(f"bandwidth {gbps:.1f} GB/s")``."""
    self.info(message)


def allocate(self, num_elements: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized 1-D heap tensor, ``ctx.empty(num_elements, dtype=dtype)``: ``ctx.allocate(64, torch.int32)``."""
    return self.empty(num_elements, dtype=dtype)


def parse_size(self, size) -> tuple[tuple[int, ...], int]:
    """The shape and element count of a factory's ``*size`` (nested at any depth) or of one integer; TypeError or
    ValueError for a dimension that is not an integer or is negative. Example: ``ctx.parse_size(((2, 3),))``
    gives ``((2, 3), 6)``."""
    if isinstance(size, numbers.Integral) and not isinstance(size, bool):
        size = (size,)
    elif not isinstance(size, (tuple, list, torch.Size)):
        raise TypeError(f"parse_size({size!r}): give a tuple or list of integers, or an integer")
    shape = normalize_size(tuple(size))
    return shape, math.prod(shape)


def deallocate(self, pointer) -> None:
    """``ctx.deallocate(buf)`` does nothing: the heap's memory returns whole at :meth:`iris.Iris.close`."""
    return None


def _device(self) -> str:
    """The heap's device as a string (``"cuda:0"``, ``"cpu"``); :meth:`iris.Iris.get_device` gives the torch.device."""
    return str(self._device)


METHODS = {"log": log, "log_debug": log_debug, "log_stats": log_stats, "allocate": allocate,
           "_Iris__allocate": allocate, "parse_size": parse_size, "deallocate": deallocate,
           "device": property(_device)}


def install() -> None:
    """Bind :data:`METHODS` onto :class:`iris.Iris` and make
    ``from iris.context import TritonContext`` give :class:`iris.DeviceContext`. Idempotent."""
    for name, method in METHODS.items():
        setattr(context.Iris, name, method)
    context.TritonContext = DeviceContext


__all__ = ["METHODS", "allocate", "deallocate", "install", "log", "log_debug", "log_stats",
           "parse_size"]
