"""A page of host memory at one fixed address in every process: what the GPU backends map for the device as the
debug record (``IRIS_RECORD_ON_HOST``), so the record's address, which kernels compile in, is the same from
process to process and the host reads the record without a GPU call.

Example:
    >>> address, words = fixed_page()          # FIXED_ADDRESS where that is free, else wherever mmap puts it
    >>> words[0] = 0
"""

from __future__ import annotations

import ctypes
import mmap

#: Where the page goes when free: far from where the kernel puts mappings by default (the top of the address
#: space down) and from the heap and the small allocations (the bottom up), 64 KiB aligned.
FIXED_ADDRESS = 0x6E69_7269_0000
PAGE_BYTES = 4096
_MAP_FIXED_NOREPLACE = 0x100000  # Linux 4.17+: fail (EEXIST) rather than replace a mapping; older kernels: a hint
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]

_page: tuple[int, ctypes.Array] | None = None


def fixed_page() -> tuple[int, ctypes.Array]:
    """(address, its 512 int64 words), zeroed; made once per process and never unmapped (kernels compiled with
    its address may run until the process ends). At :data:`FIXED_ADDRESS` where nothing is mapped there yet."""
    global _page
    if _page is None:
        protection, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        address = _libc.mmap(FIXED_ADDRESS, PAGE_BYTES, protection, flags | _MAP_FIXED_NOREPLACE, -1, 0)
        if address in (None, _MAP_FAILED):  # taken: anywhere (the address then differs between processes)
            address = _libc.mmap(None, PAGE_BYTES, protection, flags, -1, 0)
            if address in (None, _MAP_FAILED):
                raise OSError(ctypes.get_errno(), "mmap of the debug record's page failed")
        _page = address, (ctypes.c_int64 * (PAGE_BYTES // 8)).from_address(address)
    return _page
