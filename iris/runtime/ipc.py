"""Symmetric heaps on GPUs through the vendor runtime's IPC calls (ctypes).

CUDA and HIP name the same calls with different prefixes, so one implementation serves both, bound to the
runtime torch already loaded. A process cannot open its own IPC handle, and importers close their handles
before the exporter frees (``Iris.close()``: barrier, release_peers, barrier).
"""

from __future__ import annotations

import ctypes
import os
import uuid

import torch

from iris import config
from iris.runtime import host_page
from iris.runtime.base import Backend, HeapMemory, raise_if_any_rank_failed
from iris.runtime.copy_queue import StreamCopyQueue
from iris.runtime.libraries import RuntimeApiError, load_library

IPC_HANDLE_BYTES = 64  # CUDA_IPC_HANDLE_SIZE; hipIpcMemHandle_t has the same 64 reserved bytes
IPC_LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess == hipIpcMemLazyEnablePeerAccess
OUT_OF_MEMORY = 2  # cudaErrorMemoryAllocation == hipErrorOutOfMemory
HOST_REGISTER_MAPPED_PORTABLE = 0x3  # cudaHostRegisterPortable | cudaHostRegisterMapped (hip: the same bits)
MEMCPY_DEFAULT = 4  # cudaMemcpyDefault == hipMemcpyDefault: the direction from the addresses


class IpcMemHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


#: The call giving the allocation a device pointer lies in, by runtime prefix: (library, or None for the runtime's
#: own, its fallbacks, symbol). The CUDA runtime has none, so it is the driver's.
ADDRESS_RANGE_CALLS = {"cuda": ("libcuda.so", ("libcuda.so.1",), "cuMemGetAddressRange_v2"),
                       "hip": (None, (), "hipMemGetAddressRange")}

#: The stream memory operations by runtime prefix: (library, or None for the runtime's own, its fallbacks, wait
#: symbols to try, write symbols to try). CUDA has them in the driver only; 0 is "at least" in both flag sets
#: (CU_STREAM_WAIT_VALUE_GEQ, hipStreamWaitValueGte), and HIP's wait takes a mask after the flags.
STREAM_VALUE_CALLS = {"cuda": ("libcuda.so", ("libcuda.so.1",), ("cuStreamWaitValue64_v2", "cuStreamWaitValue64"),
                               ("cuStreamWriteValue64_v2", "cuStreamWriteValue64")),
                      "hip": (None, (), ("hipStreamWaitValue64",), ("hipStreamWriteValue64",))}
WAIT_AT_LEAST = 0
ALL_BITS = (1 << 64) - 1


class GpuRuntime:
    """ctypes binding of the runtime calls Iris needs, for one vendor."""

    def __init__(self, prefix: str, library_fragment: str, fallback_names: tuple[str, ...]):
        self.prefix = prefix
        self.lib = load_library(library_fragment, fallback_names, f"the {prefix} runtime library")
        self._address_range = None
        self._bind()

    def _fn(self, name, argtypes):
        fn = getattr(self.lib, self.prefix + name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn

    def _bind(self):
        vp = ctypes.c_void_p
        self._malloc = self._fn("Malloc", [ctypes.POINTER(vp), ctypes.c_size_t])
        self._free = self._fn("Free", [vp])
        self._get_handle = self._fn("IpcGetMemHandle", [ctypes.POINTER(IpcMemHandle), vp])
        self._open_handle = self._fn("IpcOpenMemHandle", [ctypes.POINTER(vp), IpcMemHandle, ctypes.c_uint])
        self._close_handle = self._fn("IpcCloseMemHandle", [vp])
        self._memcpy_async = self._fn("MemcpyAsync", [vp, vp, ctypes.c_size_t, ctypes.c_int, vp])
        size = ctypes.c_size_t
        self._memcpy_2d_async = self._fn("Memcpy2DAsync", [vp, size, vp, size, size, size, ctypes.c_int, vp])
        self._get_last_error = self._fn("GetLastError", [])
        self._error_string = getattr(self.lib, self.prefix + "GetErrorString")
        self._error_string.argtypes = [ctypes.c_int]
        self._error_string.restype = ctypes.c_char_p

    def check(self, status: int, call: str, out_of_memory: str | None = None) -> None:
        """Raise for a failed call: MemoryError with ``out_of_memory`` where given and the device is out of memory,
        else RuntimeApiError."""
        if status != 0:
            # Clear the thread's last error, or the next launch's check (torch's too) reports it as its own.
            self._get_last_error()
            if status == OUT_OF_MEMORY and out_of_memory:
                raise MemoryError(out_of_memory)
            message = self._error_string(status).decode(errors="replace")
            raise RuntimeApiError(f"{self.prefix}{call} failed with error {status}: {message}")

    def malloc(self, nbytes: int) -> int:
        """Device memory of ``nbytes``; MemoryError when the device has not that much free."""
        ptr = ctypes.c_void_p()
        self.check(self._malloc(ctypes.byref(ptr), nbytes), "Malloc",
                   out_of_memory=f"{self.prefix}Malloc of {nbytes} bytes failed: out of memory")
        return ptr.value

    def free(self, ptr: int) -> None:
        self.check(self._free(ctypes.c_void_p(ptr)), "Free")

    def ipc_handle(self, ptr: int) -> bytes:
        handle = IpcMemHandle()
        self.check(self._get_handle(ctypes.byref(handle), ctypes.c_void_p(ptr)), "IpcGetMemHandle")
        return bytes(handle)  # not handle.reserved: a c_char array stops at the first zero byte

    def open_ipc_handle(self, handle: bytes) -> int:
        if len(handle) != IPC_HANDLE_BYTES:
            raise ValueError(f"an IPC handle has {IPC_HANDLE_BYTES} bytes, got {len(handle)}")
        ptr = ctypes.c_void_p()
        status = self._open_handle(ctypes.byref(ptr), IpcMemHandle.from_buffer_copy(handle),
                                   IPC_LAZY_ENABLE_PEER_ACCESS)
        self.check(status, "IpcOpenMemHandle")
        return ptr.value

    def close_ipc_handle(self, ptr: int) -> None:
        self.check(self._close_handle(ctypes.c_void_p(ptr)), "IpcCloseMemHandle")

    def allocation_of(self, ptr: int) -> tuple[int, int]:
        """(base, bytes) of the allocation device pointer ``ptr`` lies in: an IPC handle maps a whole allocation."""
        fragment, fallbacks, symbol = ADDRESS_RANGE_CALLS[self.prefix]
        if self._address_range is None:
            lib = self.lib if fragment is None else load_library(fragment, fallbacks, "the CUDA driver library")
            self._address_range = getattr(lib, symbol)
            self._address_range.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.c_void_p]
            self._address_range.restype = ctypes.c_int
        base, size = ctypes.c_void_p(), ctypes.c_size_t()
        status = self._address_range(ctypes.byref(base), ctypes.byref(size), ctypes.c_void_p(ptr))
        if status != 0:
            raise RuntimeApiError(f"{symbol} failed with error {status} for the address {hex(ptr)}")
        return base.value, size.value

    def _stream_value_calls(self):
        """(wait, write): the stream memory operations, bound on first use."""
        if getattr(self, "_stream_values", None) is None:
            fragment, fallbacks, waits, writes = STREAM_VALUE_CALLS[self.prefix]
            lib = self.lib if fragment is None else load_library(fragment, fallbacks, "the CUDA driver library")
            wait = next(getattr(lib, name) for name in waits if hasattr(lib, name))
            write = next(getattr(lib, name) for name in writes if hasattr(lib, name))
            u64, vp = ctypes.c_uint64, ctypes.c_void_p
            wait.argtypes = [vp, vp, u64, ctypes.c_uint] + ([u64] if self.prefix == "hip" else [])
            write.argtypes = [vp, vp, u64, ctypes.c_uint]
            wait.restype = write.restype = ctypes.c_int
            self._stream_values = wait, write
        return self._stream_values

    def wait_value(self, stream: int, address: int, value: int) -> None:
        """Work queued later on ``stream`` waits until the int64 at device address ``address`` is at least ``value``."""
        wait = self._stream_value_calls()[0]
        mask = (ALL_BITS,) if self.prefix == "hip" else ()
        status = wait(ctypes.c_void_p(stream), ctypes.c_void_p(address), value, WAIT_AT_LEAST, *mask)
        if status != 0:
            raise RuntimeApiError(f"{self.prefix} stream wait on {hex(address)} failed with error {status}")

    def write_value(self, stream: int, address: int, value: int) -> None:
        """``stream`` stores ``value`` in the int64 at device address ``address``, in its order."""
        status = self._stream_value_calls()[1](ctypes.c_void_p(stream), ctypes.c_void_p(address), value, 0)
        if status != 0:
            raise RuntimeApiError(f"{self.prefix} stream write to {hex(address)} failed with error {status}")

    def map_host(self, address: int, nbytes: int) -> int:
        """Register ``nbytes`` of host memory at ``address`` for the device (page-locked, mapped, every context);
        returns the device's address of it (the host's, under unified addressing)."""
        if getattr(self, "_host_register", None) is None:
            vp = ctypes.c_void_p
            self._host_register = self._fn("HostRegister", [vp, ctypes.c_size_t, ctypes.c_uint])
            self._host_device_pointer = self._fn("HostGetDevicePointer", [ctypes.POINTER(vp), vp, ctypes.c_uint])
        self.check(self._host_register(ctypes.c_void_p(address), nbytes, HOST_REGISTER_MAPPED_PORTABLE),
                   "HostRegister")
        device = ctypes.c_void_p()
        self.check(self._host_device_pointer(ctypes.byref(device), ctypes.c_void_p(address), 0),
                   "HostGetDevicePointer")
        return device.value

    def memcpy_async(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        """``nbytes`` from ``src`` to ``dst`` on ``stream`` (a raw handle); the addresses say where they are
        (unified addressing: ``cudaMemcpyDefault`` / ``hipMemcpyDefault``)."""
        status = self._memcpy_async(ctypes.c_void_p(dst), ctypes.c_void_p(src), nbytes, MEMCPY_DEFAULT,
                                    ctypes.c_void_p(stream))
        self.check(status, "MemcpyAsync")

    def memcpy_2d_async(self, dst: int, dst_pitch: int, src: int, src_pitch: int, row_bytes: int, rows: int,
                        stream: int) -> None:
        """``rows`` rows of ``row_bytes`` from ``src`` (rows ``src_pitch`` bytes apart) to ``dst`` (``dst_pitch``
        apart) on ``stream``: one copy-engine operation (``cudaMemcpy2DAsync`` / ``hipMemcpy2DAsync``)."""
        status = self._memcpy_2d_async(ctypes.c_void_p(dst), dst_pitch, ctypes.c_void_p(src), src_pitch, row_bytes,
                                       rows, MEMCPY_DEFAULT, ctypes.c_void_p(stream))
        self.check(status, "Memcpy2DAsync")


class _DeviceAllocation:
    """Owns one runtime allocation; exposes it to torch through __cuda_array_interface__.

    torch keeps this object alive for as long as any tensor views the memory,
    so the memory is freed exactly when the last view is gone.
    """

    def __init__(self, runtime: GpuRuntime, nbytes: int):
        self.runtime = runtime
        self.ptr = runtime.malloc(nbytes)
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }

    def __del__(self):
        try:
            self.runtime.free(self.ptr)
        except Exception:  # interpreter shutdown: the driver reclaims the memory
            pass


class IpcBackend(Backend):
    """A GPU backend whose heaps are shared through runtime IPC handles."""

    runtime_prefix = ""
    library_fragment = ""
    fallback_libraries: tuple[str, ...] = ()

    def __init__(self):
        if not torch.cuda.is_available():
            raise RuntimeError(f"the {self.name} backend needs a GPU, and torch sees none; use IRIS_BACKEND=cpu")
        torch.cuda.init()  # loads the runtime library so that we bind the very same one
        self._runtime = None
        self._imported: dict[bytes, list] = {}  # IPC handle -> [mapped base, registrations using it]

    @property
    def runtime(self) -> GpuRuntime:
        if self._runtime is None:
            self._runtime = GpuRuntime(self.runtime_prefix, self.library_fragment, self.fallback_libraries)
        return self._runtime

    def device_count(self) -> int:
        return torch.cuda.device_count()

    def device_for(self, rank: int) -> torch.device:
        return torch.device("cuda", rank % self.device_count())

    def activate(self, device) -> None:
        torch.cuda.set_device(device)

    @staticmethod
    def _free_memory(device) -> str:
        free, total = torch.cuda.mem_get_info(device)
        return f"{device} has {free} of {total} bytes free"

    def synchronize(self, device, stream=None) -> None:
        if stream is None:
            torch.cuda.synchronize(device)
        else:
            stream.synchronize()

    def compute_unit_count(self, device) -> int:
        return torch.cuda.get_device_properties(device).multi_processor_count

    def shared_memory_per_program(self, device) -> int:
        from triton.runtime import driver  # Triton's own figure, the one its launcher compares with

        index = device.index if device.index is not None else torch.cuda.current_device()
        return driver.active.utils.get_device_properties(index)["max_shared_mem"]

    def copy(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        stream = torch.cuda.current_stream() if stream is None else stream
        self.runtime.memcpy_async(dst, src, nbytes, stream.cuda_stream)

    def debug_record(self, device, words):
        """Device memory; with IRIS_RECORD_ON_HOST, a page of host memory at a fixed address mapped for the device
        (:mod:`iris.runtime.host_page`): the same address in every process, read by the host directly."""
        if not config.record_on_host():
            record = torch.zeros(words, dtype=torch.int64, device=device)
            return record, record.data_ptr()
        address, page = host_page.fixed_page()
        record = torch.frombuffer(page, dtype=torch.int64, count=words)
        record.zero_()
        return record, self.runtime.map_host(address, host_page.PAGE_BYTES)

    def copy_rows(self, dst, dst_pitch, src, src_pitch, row_bytes, rows, stream=None) -> None:
        stream = torch.cuda.current_stream() if stream is None else stream
        self.runtime.memcpy_2d_async(dst, dst_pitch, src, src_pitch, row_bytes, rows, stream.cuda_stream)

    def copy_queue(self, device):
        return StreamCopyQueue(self.runtime, device)

    def export_memory(self, tensor: torch.Tensor):
        """(IPC handle of the allocation ``tensor`` lies in, byte offset of ``tensor`` in it). Memory the IPC calls
        cannot share (torch's expandable segments, cudaMallocAsync pools) fails with RuntimeApiError."""
        if tensor.device.type != "cuda":
            raise ValueError(f"a tensor on {tensor.device}: this backend maps GPU memory only")
        ptr = tensor.data_ptr()
        base, _ = self.runtime.allocation_of(ptr)
        return self.runtime.ipc_handle(base), ptr - base

    def import_memory(self, handle):
        ipc, offset = handle
        # One open per handle and process: tensors of one allocation share the mapping, closed with the last.
        entry = self._imported.setdefault(ipc, [None, 0])
        if entry[0] is None:
            try:
                entry[0] = self.runtime.open_ipc_handle(ipc)
            except Exception:
                del self._imported[ipc]
                raise
        entry[1] += 1

        def release():
            entry[1] -= 1
            if entry[1] == 0:
                del self._imported[ipc]
                self.runtime.close_ipc_handle(entry[0])

        return entry[0] + offset, release

    def create_heap(self, nbytes: int, device, comm, on_demand: bool = False) -> HeapMemory:
        self.activate(device)
        if on_demand:
            return self._create_virtual_heap(nbytes, device, comm)
        try:
            allocation, failure = _DeviceAllocation(self.runtime, nbytes), None
        except MemoryError as error:
            allocation, failure = None, f"{error}; {self._free_memory(device)}"
        raise_if_any_rank_failed(comm, failure)
        local = torch.as_tensor(allocation, device=device)
        handles = comm.all_gather_object(self.runtime.ipc_handle(allocation.ptr))
        opened: dict[int, int] = {}
        try:
            for rank, handle in enumerate(handles):
                if rank != comm.rank:
                    opened[rank] = self.runtime.open_ipc_handle(handle)
        except Exception:
            for ptr in opened.values():
                self.runtime.close_ipc_handle(ptr)
            raise
        bases = [allocation.ptr if r == comm.rank else opened[r] for r in range(comm.world_size)]

        def release_peers():
            for ptr in opened.values():
                self.runtime.close_ipc_handle(ptr)
            opened.clear()

        return HeapMemory(local=local, bases=bases, release_peers=release_peers)

    def _create_virtual_heap(self, nbytes: int, device, comm) -> HeapMemory:
        from iris.runtime.vmm import create_virtual_heap
        from iris.runtime.vmm_gpu import DeviceVirtualMemory

        torch.zeros(1, device=device)  # the device's primary context is current before any driver call
        tag = comm.broadcast_object(f"{os.getpid()}_{uuid.uuid4().hex[:8]}" if comm.rank == 0 else None, src=0)
        return create_virtual_heap(DeviceVirtualMemory(self.runtime_prefix, self.runtime.lib, device), nbytes, comm,
                                   tag)
