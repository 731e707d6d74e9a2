"""Tensors over memory given by address: ``iris.CUDAArrayInterface`` and ``iris.tensor_from_ptr``.

A GPU address becomes a tensor through ``__cuda_array_interface__`` (no copy); on the CPU backend, where
``device="cuda"`` means the heap's device as everywhere in Iris, through a ctypes buffer (no copy either).
The tensor does not own the memory: keep whatever does alive while it is used.

Example:
    >>> view = iris.tensor_from_ptr(buf.data_ptr(), buf.numel() * 4, dtype=torch.float32)
"""

from __future__ import annotations

import ctypes

import torch

from iris import runtime

#: ``__cuda_array_interface__`` type strings. bfloat16 has none of its own: it travels as a 2-byte float and
#: :func:`tensor_from_ptr` reinterprets it.
TYPESTRS = {
    torch.float64: "<f8", torch.float32: "<f4", torch.float16: "<f2", torch.bfloat16: "<f2",
    torch.int64: "<i8", torch.int32: "<i4", torch.int16: "<i2", torch.int8: "|i1", torch.uint8: "|u1",
    torch.bool: "|b1",
}


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class CUDAArrayInterface:
    """A device address seen as an array by ``__cuda_array_interface__`` (version 3), for ``torch.as_tensor``.

    Args:
        ptr: the device address (int).
        size_bytes: bytes of memory from ``ptr``.
        dtype: element type (default ``torch.uint8``); one of :data:`TYPESTRS`.
        device: the device the memory is on (default ``"cuda"``).
        shape: the array's shape (default: 1-D, ``size_bytes // element size`` elements).

    Raises:
        ValueError: ``dtype`` has no type string.

    Example:
        >>> wrapper = iris.CUDAArrayInterface(ptr, 4096, dtype=torch.float32)
        >>> tensor = torch.as_tensor(wrapper, device="cuda")
    """

    def __init__(self, ptr: int, size_bytes: int, dtype: torch.dtype = torch.uint8, device: str = "cuda",
                 shape: tuple | None = None):
        if dtype not in TYPESTRS:
            raise ValueError(f"CUDAArrayInterface(dtype={dtype}): no __cuda_array_interface__ type string; use one "
                             f"of {', '.join(str(d) for d in TYPESTRS)}")
        self.ptr = int(ptr)
        self.size_bytes = int(size_bytes)
        self.dtype = dtype
        self.device = device
        self.shape = tuple(shape) if shape is not None else (self.size_bytes // _element_size(dtype),)
        self.typestr = TYPESTRS[dtype]

    @property
    def __cuda_array_interface__(self) -> dict:
        """The protocol's dictionary: shape, type string, (address, read-only False), version 3."""
        return {"shape": self.shape, "typestr": self.typestr, "data": (self.ptr, False), "version": 3}


def _on_cpu(device) -> bool:
    wanted = torch.device(device) if not isinstance(device, torch.device) else device
    return wanted.type == "cpu" or (wanted.type == "cuda" and runtime.backend_class().memory_on_host)


def tensor_from_ptr(ptr: int, size_bytes: int, dtype: torch.dtype = torch.float32, device: str = "cuda",
                    shape: tuple | None = None) -> torch.Tensor:
    """A tensor over the memory at ``ptr``, without a copy.

    Args:
        ptr: the address (a heap tensor's ``data_ptr()``, an imported allocation, ...).
        size_bytes: bytes of memory from ``ptr``.
        dtype: element type (default ``torch.float32``).
        device: the memory's device (default ``"cuda"``: the heap's device on every backend).
        shape: the tensor's shape (default: 1-D, ``size_bytes // element size`` elements).

    Returns:
        torch.Tensor: a view of that memory; writes through it land there.

    Raises:
        ValueError: ``dtype`` is unsupported, or ``shape`` needs more than ``size_bytes``.

    Example:
        >>> view = iris.tensor_from_ptr(buf.data_ptr(), 4096, dtype=torch.float32)   # 1024 elements
    """
    interface = CUDAArrayInterface(ptr, size_bytes, dtype, device, shape)
    count = 1
    for dim in interface.shape:
        count *= int(dim)
    if count * _element_size(dtype) > interface.size_bytes:
        raise ValueError(f"tensor_from_ptr(size_bytes={size_bytes}, shape={interface.shape}, dtype={dtype}): the "
                         "shape needs more bytes than given")
    if count == 0:
        return torch.empty(interface.shape, dtype=dtype, device="cpu" if _on_cpu(device) else device)
    if _on_cpu(device):
        raw = (ctypes.c_uint8 * (count * _element_size(dtype))).from_address(interface.ptr)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(interface.shape)
    tensor = torch.as_tensor(interface, device=device)
    return tensor.view(dtype) if tensor.dtype != dtype else tensor
