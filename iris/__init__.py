"""Iris: multi-GPU programming in Triton over a symmetric heap.

Host side: ``ctx = iris.iris(heap_size)`` gives the rank, the heap and torch-like
tensor factories. Device side: ``iris.load``, ``iris.store``, ``iris.get``,
``iris.put``, ``iris.copy`` and ``iris.atomic_*`` inside ``@triton.jit`` kernels,
or the same through :class:`iris.DeviceContext`.

Importing iris picks the backend (IRIS_BACKEND=cuda|hip|cpu, else what torch
sees) and, on the CPU backend, turns on Triton's interpreter: import iris
before defining kernels (one defined earlier runs under the interpreter too: it
is launched through it). Where torch sees no GPU it also maps code written for CUDA
onto the CPU (``device="cuda"``, ``torch.cuda.*``, NCCL: ``IRIS_CPU_CUDA=0`` turns it
off). That is all an import changes outside iris; the rest (Triton's compile cache,
the logger, the launcher's stack dumps) is set up by the first ``iris.iris(...)``.
"""

from iris import runtime as _runtime  # noqa: F401  (must come first: may enable the interpreter)
from iris.context import Iris, iris
from iris import ccl, compat, ops
from iris.compat import mem, tensor_creation, tracing  # noqa: F401  (the module paths iris.mem, iris.tracing, ...)
from iris.compat.iris import Context
from iris import device
from iris.device import *  # noqa: F403  (the device API: iris.load, iris.store, ...; device.__all__ lists it)
from iris.host.debug import DeviceAccessError, WaitTimeoutError
from iris.device.ordering import Scope, Semantic
from iris.host.bench import do_bench, memset_tensor
from iris.host.devices import get_device_id_for_rank, get_num_xcc
from iris.host.pointers import CUDAArrayInterface, tensor_from_ptr
from iris.runtime.logging import DEBUG, ERROR, INFO, WARNING, logger, set_logger_level
from iris.memory.providers import HeapProviderRefusal

compat.install()  # names and module paths of code written for earlier APIs, adapted onto this one

__version__ = "0.1.0"

__all__ = [
    "CUDAArrayInterface", "Context", "DEBUG", "ERROR", "INFO", "WARNING", "DeviceAccessError", "HeapProviderRefusal",
    "Iris", "Scope", "Semantic", "WaitTimeoutError", "ccl", "do_bench", "get_device_id_for_rank", "get_num_xcc",
    "iris", "logger", "mem", "memset_tensor", "ops", "set_logger_level", "tensor_creation", "tensor_from_ptr",
]
__all__ += device.__all__


def __getattr__(name: str):
    """``iris.compile`` (the torch.compile ops), ``iris.inference`` (the engines' all-reduce) and ``iris.x`` (tile
    collectives for user kernels) are imported on first use: registering the ops costs an import."""
    import importlib

    if name in ("compile", "inference", "x"):
        return importlib.import_module(f"iris.{name}")
    if name in ("Tile", "TileView", "TensorView", "AllReduceConfig", "make_tensor_view"):  # iris.x's, here too
        return getattr(importlib.import_module("iris.x"), name)
    raise AttributeError(f"module 'iris' has no attribute {name!r}")
