"""The original Iris's module paths and names, adapted onto the native API in this one package.

Code written for the original imports ``iris.iris``, ``iris.tracing``, ``iris.tensor_creation`` and
``iris.mem.triton``; those paths are these modules, registered under the original's names by :func:`install`
(``import iris`` calls it), which also binds the original's names onto the native API (:mod:`iris.compat.context`,
:mod:`iris.compat.ops`, :mod:`iris.compat.ccl`). Native modules never import this package.

Example:
    >>> from iris.iris import DeviceContext        # iris.compat.iris
    >>> from iris.mem.triton import Context        # iris.compat.mem.triton
"""

from __future__ import annotations

import sys

from iris.compat import ccl, context, ops
from iris.compat import iris as iris_module
from iris.compat import mem, tensor_creation, tracing
from iris.compat.mem import triton as mem_triton
from iris.compat.mem.triton import context as mem_triton_context
from iris.compat.mem.triton import ops as mem_triton_ops

#: The original's module paths and the modules that stand for them.
MODULE_PATHS = {
    "iris.iris": iris_module,
    "iris.tracing": tracing,
    "iris.tensor_creation": tensor_creation,
    "iris.mem": mem,
    "iris.mem.triton": mem_triton,
    "iris.mem.triton.context": mem_triton_context,
    "iris.mem.triton.ops": mem_triton_ops,
}


def install() -> None:
    """Bind the original's names onto the native API and make its module paths importable (``from iris.iris
    import X`` finds :mod:`iris.compat.iris`). Idempotent."""
    context.install()
    ops.install()
    ccl.install()
    iris_module.install()
    for path, module in MODULE_PATHS.items():
        sys.modules.setdefault(path, module)


__all__ = ["MODULE_PATHS", "ccl", "context", "install", "iris_module", "mem", "ops", "tensor_creation", "tracing"]
