"""The host driver of the virtual-memory heap (:mod:`iris.runtime.vmm`), for the CPU backend: the range is
reserved as inaccessible address space, each chunk is a memfd (shared memory a descriptor names) mapped into it,
and peers map the same memfd at the same offset of their view, so Triton's interpreter and its atomics reach it
from every rank's process.

Example:
    >>> driver = HostVirtualMemory()
    >>> address = driver.reserve(64 << 30)        # address space only: nothing is backed
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import torch

from iris.runtime.shm import capacity_report

# Linux's values (x86-64 and arm64 alike); Python's mmap module lacks PROT_NONE and MAP_FIXED
_PROT_NONE, _PROT_READ_WRITE = 0, 0x3
_MAP_SHARED, _MAP_PRIVATE, _MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x1, 0x2, 0x10, 0x20, 0x4000
_MAP_FAILED = ctypes.c_void_p(-1).value
#: chunk size: Hopper's granularity, so both heaps grow in the same steps
GRANULARITY = 2 << 20


class HostVirtualMemory:
    """memfd chunks mapped into reserved host address space."""

    granularity = GRANULARITY

    def __init__(self):
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._mmap = self._libc.mmap
        self._mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                               ctypes.c_long]
        self._mmap.restype = ctypes.c_void_p
        self._munmap = self._libc.munmap
        self._munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        self._munmap.restype = ctypes.c_int

    def _call_mmap(self, address, nbytes: int, protection: int, flags: int, fd: int, what: str) -> int:
        result = self._mmap(address, nbytes, protection, flags, fd, 0)
        if result in (None, _MAP_FAILED):
            error = ctypes.get_errno()
            raise OSError(error, f"mmap ({what}) of {nbytes} bytes: {os.strerror(error)}")
        return result

    def _inaccessible(self, address, nbytes: int, what: str, fixed: int = 0) -> int:
        return self._call_mmap(address, nbytes, _PROT_NONE, _MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE | fixed, -1,
                               what)

    def reserve(self, nbytes: int) -> int:
        return self._inaccessible(None, nbytes, "reserving the heap's address range")

    def free_range(self, address: int, nbytes: int) -> None:
        if self._munmap(address, nbytes):
            raise OSError(ctypes.get_errno(), "munmap of a heap range failed")

    def create(self, nbytes: int) -> int:
        fd = os.memfd_create("iris_heap_chunk", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, nbytes)  # sparse: pages take memory when first touched
        except OSError:
            os.close(fd)
            raise
        return fd

    def release(self, handle: int) -> None:
        os.close(handle)

    def export(self, handle: int) -> int:
        return os.dup(handle)

    def import_(self, fd: int) -> int:
        return os.dup(fd)

    def map(self, address: int, nbytes: int, handle: int) -> None:
        self._call_mmap(address, nbytes, _PROT_READ_WRITE, _MAP_SHARED | _MAP_FIXED, handle, "mapping a heap chunk")

    def unmap(self, address: int, nbytes: int) -> None:
        self._inaccessible(address, nbytes, "unmapping a heap chunk", fixed=_MAP_FIXED)  # the range stays reserved

    @staticmethod
    def free_note() -> str:
        return capacity_report()

    @staticmethod
    def tensor(owner, address: int, nbytes: int) -> torch.Tensor:
        """A flat uint8 tensor over ``nbytes`` at ``address`` that keeps ``owner`` alive while any view lives."""
        array = (ctypes.c_ubyte * nbytes).from_address(address)
        array.owner = owner
        return torch.frombuffer(array, dtype=torch.uint8)
