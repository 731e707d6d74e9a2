"""Programs written for CUDA run unchanged on the CPU backend: ``device="cuda"`` means the CPU.

Where torch sees no GPU, :func:`install` (at ``import iris``) rewrites CUDA device arguments to the CPU,
serves ``torch.cuda``'s device, stream and event calls on the host (events read the host clock), runs
``backend="nccl"`` groups on gloo, and makes what the host cannot give (graphs) raise an error naming the call.
``torch.cuda.is_available()`` stays False, so torch's own code never reaches for a driver. The function mode
belongs to the installing thread only.

Example:
    >>> import iris, torch                     # IRIS_BACKEND=cpu, no GPU
    >>> torch.cuda.set_device(1)
    >>> x = torch.ones(4, device="cuda")       # on the CPU
    >>> start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    >>> start.record(); y = x * 2; end.record(); torch.cuda.synchronize()
    >>> start.elapsed_time(end) >= 0.0
    True
"""

from __future__ import annotations

import functools
import inspect
import os
import platform
import sys
import threading
import time
import warnings
from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode

from iris import config

_CPU = torch.device("cpu")
_installed = False
_nccl_warned = False
_local = threading.local()  # the current device index and stream, per thread as in CUDA


class CudaOnCpuError(RuntimeError):
    """A ``torch.cuda`` call asks for something the CPU backend cannot give (a CUDA graph, a compute capability)."""


def _names_cuda(device) -> bool:
    """Whether a device argument means a CUDA device (an index too: torch reads it as the accelerator's)."""
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _index(device=None) -> int:
    """The CUDA index a ``torch.cuda`` call's device argument names; the current one for None or plain "cuda"."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return current_device() if device.index is None else device.index


def _refusal(call: str, why: str) -> str:
    return (f"{call}: {why}. On the CPU backend Iris serves device=\"cuda\", set_device, synchronize, streams, "
            "events and the device's properties on the host (docs/guides/backends.md); run this on a GPU, or "
            "set IRIS_CPU_CUDA=0 to see torch's own behaviour")


class _CpuForCuda(TorchFunctionMode):
    """Rewrites device arguments that name CUDA to the CPU, on every torch function and tensor method."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if kwargs:
            device = kwargs.get("device")
            if device is not None and _names_cuda(device):
                kwargs = {**kwargs, "device": _CPU}
            if kwargs.get("pin_memory"):
                kwargs = {**kwargs, "pin_memory": False}
        else:
            kwargs = {}
        method = _METHODS.get(func)
        if method is not None:
            return method(*args, **kwargs)
        return func(*args, **kwargs)


def _to(tensor, *args, **kwargs):
    if args and _names_cuda(args[0]):
        args = (_CPU, *args[1:])
    return torch.Tensor.to(tensor, *args, **kwargs)


_METHODS = {
    torch.Tensor.to: _to,
    torch.Tensor.cuda: lambda tensor, *args, **kwargs: tensor,
    torch.Tensor.pin_memory: lambda tensor, *args, **kwargs: tensor,
}


def _record_stream(tensor, stream) -> None:
    """``Tensor.record_stream``: nothing to keep alive, the host's streams have run already."""


def current_device() -> int:
    """The index the last ``torch.cuda.set_device`` chose in this thread (0 at first)."""
    return getattr(_local, "device", 0)


def set_device(device) -> None:
    """Remember ``device`` as the current one; work stays on the host."""
    _local.device = _index(device)


class device:  # noqa: N801  (torch.cuda.device's name)
    """``with torch.cuda.device(i):`` makes ``i`` current inside the block."""

    def __init__(self, device):
        self.index = -1 if device is None else _index(device)

    def __enter__(self):
        self.previous = current_device()
        if self.index >= 0:
            set_device(self.index)
        return self

    def __exit__(self, *exc):
        set_device(self.previous)
        return False


def synchronize(device=None) -> None:
    """Nothing to wait for: a kernel on the CPU backend has run to completion when its launch returns."""


def get_device_name(device=None) -> str:
    """The host's processor, named as a device."""
    return f"CPU ({platform.processor() or platform.machine()}, Iris CPU backend)"


class HostProperties(NamedTuple):
    """What ``torch.cuda.get_device_properties`` tells of a GPU, told of the host."""

    name: str
    total_memory: int
    multi_processor_count: int
    major: int = 0
    minor: int = 0
    gcnArchName: str = "cpu"  # noqa: N815  (torch's field name)
    warp_size: int = 1
    is_integrated: bool = True


def _memory() -> tuple[int, int]:
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def get_device_properties(device=None) -> HostProperties:
    """The host's name, memory and core count (the CPU backend's compute units)."""
    return HostProperties(get_device_name(), _memory()[1], os.cpu_count() or 1)


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) bytes of the host's memory."""
    return _memory()


def _zero(*args, **kwargs) -> int:
    return 0


def _nothing(*args, **kwargs) -> None:
    return None


class Event:
    """A CUDA event on the host: ``record`` reads ``time.perf_counter``; the work before it has already run."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False):
        self.enable_timing = enable_timing
        self.recorded_at = None

    def record(self, stream=None) -> None:
        self.recorded_at = time.perf_counter()

    def wait(self, stream=None) -> None:
        """Nothing to wait for: the host ran everything before this event already."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for (see :meth:`wait`)."""

    def elapsed_time(self, end_event: Event) -> float:
        """Milliseconds of host time from this event's record to ``end_event``'s."""
        if self.recorded_at is None or end_event.recorded_at is None:
            raise RuntimeError("torch.cuda.Event.elapsed_time: both events must be recorded first (event.record())")
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("torch.cuda.Event.elapsed_time: both events must be made with enable_timing=True")
        return (end_event.recorded_at - self.recorded_at) * 1e3

    def ipc_handle(self):
        raise CudaOnCpuError(_refusal("torch.cuda.Event.ipc_handle()", "the host has no event to share"))


class Stream:
    """A CUDA stream on the host: its work runs at once, in program order, so every wait is already over."""

    cuda_stream = 0

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = _CPU
        self.priority = priority

    def wait_stream(self, stream) -> None:
        """Nothing to wait for: the other stream's work has run."""

    def wait_event(self, event) -> None:
        """Nothing to wait for: the event's work has run."""

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""

    def __enter__(self):
        self._context = stream(self)
        return self._context.__enter__()

    def __exit__(self, *exc):
        return self._context.__exit__(*exc)


_DEFAULT_STREAM = Stream()


def current_stream(device=None) -> Stream:
    """The stream of the innermost ``with torch.cuda.stream(s):`` in this thread, else the default stream."""
    return getattr(_local, "stream", None) or _DEFAULT_STREAM


def default_stream(device=None) -> Stream:
    """The one default stream of the process."""
    return _DEFAULT_STREAM


def set_stream(stream: Stream) -> None:
    """Make ``stream`` the current stream of this thread."""
    _local.stream = stream


class stream:  # noqa: N801  (torch.cuda.stream's name)
    """``with torch.cuda.stream(s):`` makes ``s`` current inside the block (None: the current stream stays)."""

    def __init__(self, stream: Stream | None):
        self.stream = stream

    def __enter__(self):
        self.previous = getattr(_local, "stream", None)
        if self.stream is not None:
            _local.stream = self.stream
        return self.stream

    def __exit__(self, *exc):
        _local.stream = self.previous
        return False


def _refused_class(name: str, why: str):
    def __new__(cls, *args, **kwargs):
        raise CudaOnCpuError(_refusal(f"torch.cuda.{name}", why))

    return type(name, (), {"__new__": __new__, "__doc__": f"torch.cuda.{name} is refused: {why}."})


def _refused_function(name: str, why: str):
    def refused(*args, **kwargs):
        raise CudaOnCpuError(_refusal(f"torch.cuda.{name}()", why))

    refused.__name__ = name
    return refused


_GRAPHS = "the CPU backend runs each kernel on the host at once, with no queue of GPU work to capture"
_REFUSED = {
    "CUDAGraph": _refused_class("CUDAGraph", _GRAPHS),
    "graph": _refused_class("graph", _GRAPHS),
    "make_graphed_callables": _refused_function("make_graphed_callables", _GRAPHS),
    "get_device_capability": _refused_function("get_device_capability", "there is no GPU, so no compute "
                                                                          "capability, on the CPU backend"),
}

_SERVED = {
    "current_device": current_device, "set_device": set_device, "device": device, "synchronize": synchronize,
    "get_device_name": get_device_name, "get_device_properties": get_device_properties,
    "mem_get_info": mem_get_info, "Stream": Stream, "Event": Event, "current_stream": current_stream,
    "default_stream": default_stream, "set_stream": set_stream, "stream": stream,
    "is_current_stream_capturing": lambda: False, "empty_cache": _nothing, "reset_peak_memory_stats": _nothing,
    "reset_max_memory_allocated": _nothing, "memory_allocated": _zero, "max_memory_allocated": _zero,
    "memory_reserved": _zero, "max_memory_reserved": _zero, **_REFUSED,
}


def _named_lazy_init(torch_lazy_init):
    """torch.cuda's ``_lazy_init``, reached by any call not served here: torch's error, naming that call."""

    @functools.wraps(torch_lazy_init)
    def _lazy_init():
        try:
            torch_lazy_init()
        except Exception as exc:
            message = _refusal(f"{_torch_cuda_caller()}()", "it needs a GPU, and the CPU backend has none")
            try:
                named = type(exc)(message)
            except Exception:  # an exception type that takes other arguments
                named = CudaOnCpuError(message)
            raise named from exc

    return _lazy_init


def _torch_cuda_caller() -> str:
    """The outermost frame inside torch/cuda on the stack: the torch.cuda call the program made."""
    inside = os.sep + os.path.join("torch", "cuda") + os.sep
    frame, name = sys._getframe(2), None
    while frame is not None and inside in frame.f_code.co_filename:
        name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name)
        frame = frame.f_back
    if name is None:
        return "torch.cuda"
    return "torch.cuda." + name.removesuffix(".__init__").removesuffix(".__new__")


def host_backend(backend):
    """The torch.distributed backend that serves ``backend`` on the host: gloo for a request that names NCCL
    (``"nccl"``, ``"cpu:gloo,cuda:nccl"``), anything else unchanged.

    Example:
        >>> host_backend("nccl"), host_backend("gloo"), host_backend(None)
        ('gloo', 'gloo', None)
    """
    if backend is not None and "nccl" in str(backend).lower():
        return "gloo"
    return backend


def _gloo_for_nccl(torch_call, call: str):
    signature = inspect.signature(torch_call)

    @functools.wraps(torch_call)
    def wrapped(*args, **kwargs):
        bound = signature.bind_partial(*args, **kwargs)
        requested = bound.arguments.get("backend")
        if host_backend(requested) != requested:
            bound.arguments["backend"] = "gloo"
            _warn_nccl_once(call, requested)
        if _names_cuda(bound.arguments.get("device_id")):
            bound.arguments["device_id"] = None  # gloo binds no device
        return torch_call(*bound.args, **bound.kwargs)

    return wrapped


def _warn_nccl_once(call: str, requested) -> None:
    global _nccl_warned
    if not _nccl_warned:
        _nccl_warned = True
        warnings.warn(f"iris: torch.distributed.{call}(backend=\"{requested}\") runs on gloo: NCCL needs GPUs and "
                      "the CPU backend has none (IRIS_CPU_CUDA=0 turns this off)", stacklevel=3)


def installed() -> bool:
    """Whether this process runs ``device="cuda"`` and ``torch.cuda``'s calls on the host."""
    return _installed


def install() -> bool:
    """Serve CUDA-style code on the host, once per process, unless IRIS_CPU_CUDA=0 or torch sees a GPU.

    Returns whether it is on.

    Raises:
        ValueError: IRIS_CPU_CUDA holds a word that is not a switch.
    """
    global _installed
    if _installed:
        return True
    if not config.cpu_cuda() or torch.cuda.is_available():
        return False
    _CpuForCuda().__enter__()  # for the rest of the process (this thread's mode stack)
    for name, value in _SERVED.items():
        setattr(torch.cuda, name, value)
    for name in ("range_push", "range_pop", "mark", "range_start", "range_end"):
        if hasattr(torch.cuda.nvtx, name):
            setattr(torch.cuda.nvtx, name, _nothing)
    for module in [m for name, m in sys.modules.items() if name == "torch.cuda" or name.startswith("torch.cuda.")]:
        found = getattr(module, "_lazy_init", None)
        if found is not None and not hasattr(found, "__wrapped__"):
            module._lazy_init = _named_lazy_init(found)
    torch.Tensor.record_stream = _record_stream  # torch parses its argument before any mode could see it
    default_device = torch.set_default_device
    torch.set_default_device = functools.wraps(default_device)(
        lambda device: default_device(_CPU if device is not None and _names_cuda(device) else device))
    import torch.distributed as dist

    if dist.is_available():
        dist.init_process_group = _gloo_for_nccl(dist.init_process_group, "init_process_group")
        dist.new_group = _gloo_for_nccl(dist.new_group, "new_group")
    _installed = True
    return True
