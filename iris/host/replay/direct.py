"""A remembered call of one kernel launched by the driver's ``cuLaunchKernel`` with its arguments packed once (CUDA).

A repeated small call (a 1 KiB all_reduce) costs the host a graph launch (``cuGraphLaunch``) and the GPU a graph's
start; a call that is one kernel can skip both: its parameter block is packed once, from the kernel's own
parameter layout (the driver's ``cuFuncGetParamInfo``: each parameter's offset and size), and every replay is one
``cuLaunchKernel`` of the compiled function on the current stream. Switch: ``IRIS_DIRECT_LAUNCH`` (off by default
until measured; see :meth:`iris.host.replay.Plans.replay`).

Only plain launches qualify (:func:`packed`): every parameter a pointer, an integer or a 32/64-bit float; no
tensor descriptors; no cluster (``num_ctas`` 1), cooperative grid or programmatic dependent launch; no global or
profile scratch (the trailing scratch parameters Triton adds are then passed as NULL, as its launcher does). Any
other launch keeps its graph.

Example:
    >>> launch = direct_launcher(bind(my_kernel, (4,), x, n, BLOCK=256))
    >>> launch()   # my_kernel[(4,)](x, n, BLOCK=256), one cuLaunchKernel
"""

from __future__ import annotations

import ctypes
import functools
import struct

import torch

CUDA_SUCCESS, CUDA_ERROR_INVALID_VALUE = 0, 1


@functools.cache
def driver_functions():
    """``(cuLaunchKernel, cuFuncGetParamInfo)`` of the CUDA driver as ctypes functions, or None where the driver (or
    ``cuFuncGetParamInfo``, CUDA 12.4 on) is missing."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        launch, param_info = driver.cuLaunchKernel, driver.cuFuncGetParamInfo
    except (OSError, AttributeError):
        return None
    launch.restype = param_info.restype = ctypes.c_int
    launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 6 + [ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p,
                                                                  ctypes.c_void_p]
    param_info.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t),
                           ctypes.POINTER(ctypes.c_size_t)]
    return launch, param_info


def parameter_layout(function: int, param_info) -> list[tuple[int, int]]:
    """``[(offset, size), ...]`` of the compiled ``function``'s parameters, as the driver reports them."""
    layout, offset, size = [], ctypes.c_size_t(), ctypes.c_size_t()
    while True:
        result = param_info(ctypes.c_void_p(function), len(layout), ctypes.byref(offset), ctypes.byref(size))
        if result == CUDA_ERROR_INVALID_VALUE:  # past the last parameter
            return layout
        if result != CUDA_SUCCESS:
            raise RuntimeError(f"cuFuncGetParamInfo failed: CUresult {result}")
        layout.append((offset.value, size.value))


def pack_value(kind: str, value, size: int) -> bytes | None:
    """``value`` of Triton signature type ``kind`` as the ``size`` bytes the kernel takes, or None where it is not a
    plain scalar or pointer of that size.

    Example:
        >>> pack_value("*fp32", 0x7F0000001000, 8) == (0x7F0000001000).to_bytes(8, "little")
        True
        >>> pack_value("i32", -1, 4), pack_value("fp32", 0.5, 4) == struct.pack("<f", 0.5)
        (b'\\xff\\xff\\xff\\xff', True)
    """
    if kind.startswith("*"):
        return int(value).to_bytes(8, "little", signed=False) if size == 8 else None
    if kind in ("fp32", "fp64"):
        width = 4 if kind == "fp32" else 8
        return struct.pack("<f" if width == 4 else "<d", float(value)) if size == width else None
    if kind[:1] in ("i", "u") and kind[1:].isdigit():
        width = max(1, int(kind[1:]) // 8)
        if size != width:
            return None
        try:
            return int(value).to_bytes(width, "little", signed=int(value) < 0)
        except OverflowError:
            return None
    return None


def packed(kinds, values, layout, metadata) -> bytes | None:
    """The parameter block of one launch: each non-constexpr ``values`` entry (in order, beside its signature type in
    ``kinds``) at its offset of ``layout``, then the trailing parameters Triton adds (scratch pointers) as NULL; None
    where the launch is not a plain one (see the module's docstring).

    Example:
        >>> packed(["*fp32", "i32", "constexpr"], [0x1000, 7, 256], [(0, 8), (8, 4), (16, 8), (24, 8)],
        ...        {"num_ctas": 1}).hex()
        '0010000000000000070000000000000000000000000000000000000000000000'
    """
    if any(metadata.get(name) for name in ("launch_cooperative_grid", "launch_pdl", "global_scratch_size",
                                           "profile_scratch_size")) or metadata.get("num_ctas", 1) != 1:
        return None
    given = [(kind, value) for kind, value in zip(kinds, values) if kind != "constexpr"]
    if len(given) > len(layout) or any(size != 8 for _, size in layout[len(given):]):
        return None  # the trailing parameters are Triton's scratch pointers, one pointer each
    end = max((offset + size for offset, size in layout), default=0)
    block = bytearray(end)
    for (kind, value), (offset, size) in zip(given, layout):
        data = pack_value(kind, value, size)
        if data is None:
            return None
        block[offset:offset + size] = data
    return bytes(block)


class DirectLaunch:
    """One kernel launch, packed once, launched by ``cuLaunchKernel`` on ``device``'s current stream (see
    :func:`direct_launcher`). ``native``: what the C replay (iris.host.replay.native) launches from:
    ``(function, grid x, y, z, threads, shared bytes, address of the parameter pointer array, device)``."""

    def __init__(self, function: int, grid, threads: int, shared: int, block: bytes, layout, device: int, launch):
        self._block = ctypes.create_string_buffer(block, max(1, len(block)))
        base = ctypes.addressof(self._block)
        self._pointers = (ctypes.c_void_p * max(1, len(layout)))(*(base + offset for offset, _ in layout))
        self._function, self._grid, self._threads, self._shared = ctypes.c_void_p(function), grid, threads, shared
        self._device, self._launch = device, launch
        self.native = (function, *grid, threads, shared, ctypes.addressof(self._pointers), device)

    def __call__(self) -> None:
        stream = torch._C._cuda_getCurrentRawStream(self._device)
        gx, gy, gz = self._grid
        result = self._launch(self._function, gx, gy, gz, self._threads, 1, 1, self._shared, stream,
                              self._pointers, None)
        if result:
            raise RuntimeError(f"cuLaunchKernel of a remembered call's kernel failed: CUresult {result}")


def direct_launcher(bound) -> DirectLaunch | None:
    """``bound`` (a compiled :class:`iris.host.replay.BoundLaunch`) as a :class:`DirectLaunch`, or None where the
    driver lacks what it takes or the launch is not a plain one."""
    functions = driver_functions()
    compiled = getattr(bound, "_compiled", None)
    if functions is None or compiled is None:
        return None
    launch, param_info = functions
    metadata = compiled.metadata._asdict() if hasattr(compiled.metadata, "_asdict") else dict(vars(compiled.metadata))
    kinds = list(compiled.src.signature.values())
    if any("tensordesc" in str(kind) for kind in kinds) or len(kinds) != len(bound._values):
        return None
    try:
        layout = parameter_layout(compiled.function, param_info)
    except RuntimeError:
        return None
    block = packed(kinds, bound._values, layout, metadata)
    if block is None:
        return None
    threads = 32 * int(metadata.get("num_warps", 4))
    return DirectLaunch(compiled.function, bound._grid, threads, int(metadata.get("shared", 0)), block, layout,
                        bound._device, launch)
