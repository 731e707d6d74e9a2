"""The GPU driver of the virtual-memory heap (:mod:`iris.runtime.vmm`): chunks made, exported as POSIX file
descriptors, imported and mapped through the driver's virtual-memory calls, by ctypes (CUDA: ``cuMemCreate``,
``cuMemAddressReserve``, ``cuMemMap``, ``cuMemSetAccess``, ``cuMemExportToShareableHandle`` ...; HIP: the same
calls named ``hipMem*``), bound to the library torch already loaded.

Example:
    >>> driver = DeviceVirtualMemory("cuda", runtime.lib, torch.device("cuda", 0))
    >>> driver.granularity
    2097152
"""

from __future__ import annotations

import ctypes

import torch

from iris.runtime.libraries import RuntimeApiError, load_library

ALLOCATION_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED == hipMemAllocationTypePinned
HANDLE_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR == hipMemHandleTypePosixFileDescriptor
LOCATION_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE == hipMemLocationTypeDevice
ACCESS_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE == hipMemAccessFlagsProtReadWrite
GRANULARITY_MINIMUM = 0  # CU_MEM_ALLOC_GRANULARITY_MINIMUM == hipMemAllocationGranularityMinimum
OUT_OF_MEMORY = 2  # CUDA_ERROR_OUT_OF_MEMORY == hipErrorOutOfMemory

#: By runtime prefix: (library fragment or None for the runtime torch loaded, fallbacks, call prefix).
DRIVERS = {"cuda": ("libcuda.so", ("libcuda.so.1",), "cu"), "hip": (None, (), "hip")}


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocationFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocationProp(ctypes.Structure):
    """CUmemAllocationProp / hipMemAllocationProp (the same 32 bytes)."""

    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocationFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


class DeviceVirtualMemory:
    """The virtual-memory calls of one vendor's driver, for the chunks of one device (a driver of
    :mod:`iris.runtime.vmm`); ``runtime_library``: the runtime torch loaded (HIP's calls live there)."""

    def __init__(self, runtime_prefix: str, runtime_library: ctypes.CDLL, device: torch.device):
        fragment, fallbacks, self.prefix = DRIVERS[runtime_prefix]
        self.lib = runtime_library if fragment is None else load_library(fragment, fallbacks, "the GPU driver")
        self.device = device
        self.ordinal = device.index if device.index is not None else torch.cuda.current_device()
        u64, vp, size = ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t
        granularity = self._fn("MemGetAllocationGranularity",
                               [ctypes.POINTER(size), ctypes.POINTER(AllocationProp), ctypes.c_int])
        self._create = self._fn("MemCreate", [ctypes.POINTER(u64), size, ctypes.POINTER(AllocationProp), u64])
        self._release = self._fn("MemRelease", [u64])
        self._reserve = self._fn("MemAddressReserve", [ctypes.POINTER(u64), size, size, u64, u64])
        self._address_free = self._fn("MemAddressFree", [u64, size])
        self._map = self._fn("MemMap", [u64, size, size, u64, u64])
        self._unmap = self._fn("MemUnmap", [u64, size])
        self._set_access = self._fn("MemSetAccess", [u64, size, ctypes.POINTER(AccessDesc), size])
        self._export = self._fn("MemExportToShareableHandle", [vp, u64, ctypes.c_int, u64])
        self._import = self._fn("MemImportFromShareableHandle", [ctypes.POINTER(u64), vp, ctypes.c_int])
        value = ctypes.c_size_t()
        self.check(granularity(ctypes.byref(value), ctypes.byref(self._prop()), GRANULARITY_MINIMUM),
                   "MemGetAllocationGranularity")
        #: the size every chunk and mapping is a multiple of on this device (2 MiB on Hopper)
        self.granularity = value.value

    def _fn(self, name, argtypes):
        fn = getattr(self.lib, self.prefix + name)
        fn.argtypes = argtypes
        fn.restype = ctypes.c_int
        return fn

    def _message(self, status: int) -> str:
        if self.prefix == "cu":
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(status, ctypes.byref(text))
            return (text.value or b"").decode(errors="replace")
        self.lib.hipGetErrorString.restype = ctypes.c_char_p
        return (self.lib.hipGetErrorString(status) or b"").decode(errors="replace")

    def check(self, status: int, call: str, out_of_memory: str | None = None) -> None:
        if status == 0:
            return
        if status == OUT_OF_MEMORY and out_of_memory:
            raise MemoryError(out_of_memory)
        raise RuntimeApiError(f"{self.prefix}{call} failed with error {status}: {self._message(status)}")

    def _prop(self) -> AllocationProp:
        prop = AllocationProp()
        prop.type = ALLOCATION_PINNED
        prop.requestedHandleTypes = HANDLE_POSIX_FD
        prop.location = MemLocation(LOCATION_DEVICE, self.ordinal)
        return prop

    def reserve(self, nbytes: int) -> int:
        address = ctypes.c_uint64()
        self.check(self._reserve(ctypes.byref(address), nbytes, self.granularity, 0, 0), "MemAddressReserve",
                   out_of_memory=f"cannot reserve {nbytes} bytes of address space")
        return address.value

    def free_range(self, address: int, nbytes: int) -> None:
        self.check(self._address_free(address, nbytes), "MemAddressFree")

    def create(self, nbytes: int) -> int:
        handle = ctypes.c_uint64()
        self.check(self._create(ctypes.byref(handle), nbytes, ctypes.byref(self._prop()), 0),
                   "MemCreate", out_of_memory=f"{self.prefix}MemCreate of {nbytes} bytes: out of memory")
        return handle.value

    def release(self, handle: int) -> None:
        self.check(self._release(handle), "MemRelease")

    def export(self, handle: int) -> int:
        fd = ctypes.c_int(-1)
        self.check(self._export(ctypes.byref(fd), handle, HANDLE_POSIX_FD, 0), "MemExportToShareableHandle")
        return fd.value

    def import_(self, fd: int) -> int:
        handle = ctypes.c_uint64()
        # the descriptor travels in the pointer argument itself, as the driver documents for POSIX descriptors
        self.check(self._import(ctypes.byref(handle), ctypes.c_void_p(fd), HANDLE_POSIX_FD),
                   "MemImportFromShareableHandle")
        return handle.value

    def map(self, address: int, nbytes: int, handle: int) -> None:
        """Map chunk ``handle`` at ``address`` and let this device read and write it."""
        self.check(self._map(address, nbytes, 0, handle, 0), "MemMap")
        access = AccessDesc(MemLocation(LOCATION_DEVICE, self.ordinal), ACCESS_READ_WRITE)
        status = self._set_access(address, nbytes, ctypes.byref(access), 1)
        if status:
            self._unmap(address, nbytes)
            self.check(status, "MemSetAccess")

    def unmap(self, address: int, nbytes: int) -> None:
        self.check(self._unmap(address, nbytes), "MemUnmap")

    def free_note(self) -> str:
        free, total = torch.cuda.mem_get_info(self.ordinal)
        return f"{free} of {total} bytes of {self.device} free"

    def tensor(self, owner, address: int, nbytes: int) -> torch.Tensor:
        """A flat uint8 tensor over ``nbytes`` at ``address`` (its first bytes backed, so torch can tell its
        device), keeping ``owner`` alive while any view lives."""
        return torch.as_tensor(_CudaArray(owner, address, nbytes), device=self.device)


class _CudaArray:
    def __init__(self, owner, address: int, nbytes: int):
        self.owner = owner
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                         "version": 3, "strides": None, "stream": None}
