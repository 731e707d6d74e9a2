"""The Triton device API: call these from ``@triton.jit`` kernels."""

from iris.device.atomics import (
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
)
from iris.device.context import DeviceContext, TritonContext
from iris.device.tracing import DeviceTracing, TraceEvent
from iris.device.rma import copy, current_rank, get, load, put, store, translate
from iris.device.sync import signal, wait_until

__all__ = [
    "DeviceContext", "DeviceTracing", "TraceEvent", "atomic_add", "atomic_and", "atomic_cas", "atomic_max",
    "atomic_min", "atomic_or", "atomic_sub", "atomic_xchg", "atomic_xor", "copy", "current_rank", "get", "load",
    "put", "signal", "store", "translate", "TritonContext", "wait_until",
]
