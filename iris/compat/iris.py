"""The original's module ``iris.iris``: code written for it imports from here
(``from iris.iris import DeviceContext``), while ``iris.iris(heap_size)`` stays the factory.

``import iris`` registers this module as ``iris.iris`` (:func:`iris.compat.install`), while the attribute
``iris.iris`` is the factory, which :func:`install` gives this module's names too (for ``import iris.iris as m``).

Example:
    >>> from iris.iris import DeviceContext, Iris
    >>> ctx = iris.iris(1 << 30)          # the factory, as before
"""

from iris import device
from iris.context import Iris, iris
from iris.runtime import logging as log

Context = device.DeviceContext
_DEVICE = [name for name in device.__all__ if name not in ("TritonContext", "current_rank", "signal", "wait_until")]
_LOGGING = ["DEBUG", "ERROR", "INFO", "WARNING", "logger", "set_logger_level"]
globals().update({name: getattr(device, name) for name in _DEVICE})
globals().update({name: getattr(log, name) for name in _LOGGING})

__all__ = ["Context", "Iris", "iris"]
__all__ += _DEVICE + _LOGGING


def install() -> None:
    """Give the factory ``iris.iris`` this module's names: ``import iris.iris as m`` reads the attribute."""
    for name in __all__:
        if name != "iris":
            setattr(iris, name, globals()[name])
