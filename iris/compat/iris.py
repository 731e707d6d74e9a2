"""The original's module ``iris.iris``: code written for it imports from here
(``from iris.iris import DeviceContext``), while ``iris.iris(heap_size)`` stays the factory.

Both hold because the package imports this module before it binds the name ``iris`` to the factory:
Python keeps a loaded submodule in ``sys.modules``, so ``from iris.iris import X`` finds this module,
and the attribute ``iris.iris`` is the factory (which carries this module's names as attributes too, for
``import iris.iris as m``).

Example:
    >>> from iris.iris import DeviceContext, Iris
    >>> ctx = iris.iris(1 << 30)          # the factory, as before
"""

from iris.context import Iris, iris
from iris.device import (
    DeviceContext,
    DeviceTracing,
    TraceEvent,
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
    translate,
)
from iris.runtime.logging import DEBUG, ERROR, INFO, WARNING, logger, set_logger_level

Context = DeviceContext

__all__ = [
    "Context", "DEBUG", "DeviceContext", "DeviceTracing", "ERROR", "INFO", "Iris", "TraceEvent", "WARNING",
    "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub", "atomic_xchg",
    "atomic_xor", "copy", "get", "iris", "load", "logger", "put", "set_logger_level", "store", "translate",
]
