"""The original's module of tensor factories (``iris.tensor_creation``): the factories of the context as
functions of a heap and its device, and the checks they share.

Each factory takes the symmetric heap (``ctx.heap``) and the heap's device (``ctx.get_device()``) first,
then ``torch``'s arguments; it does what the context's method of the same name does (see
:class:`iris.Iris`), and refuses a ``device`` that is not the heap's with RuntimeError, as the original.
``device="cuda"`` means the heap's device on every backend.

Example:
    >>> from iris import tensor_creation
    >>> x = tensor_creation.zeros(ctx.heap, ctx.get_device(), (2, 3), dtype=torch.float32)
    >>> ctx.is_symmetric(x)
    True
"""

from __future__ import annotations

import math

import torch

from iris.memory.tensors import TensorFactories, normalize_size

__all__ = ["allocate", "apply_layout", "apply_memory_format", "arange", "empty", "full", "is_valid_device",
           "linspace", "ones", "parse_size", "rand", "randint", "randn", "throw_if_invalid_device",
           "throw_if_invalid_output_tensor", "uniform", "zeros", "zeros_like"]


class _OnHeap(TensorFactories):
    """The context's factories over a bare heap."""

    def __init__(self, heap):
        self.heap = getattr(heap, "heap", heap)  # an Iris context passed for its heap works too


def _factories(heap, iris_device, device) -> _OnHeap:
    throw_if_invalid_device(device, iris_device)
    return _OnHeap(heap)


def _is_on_heap(heap, tensor: torch.Tensor) -> bool:
    heap = getattr(heap, "heap", heap)
    return heap.is_symmetric(tensor) if hasattr(heap, "is_symmetric") else heap.contains(tensor)


# -- the shared checks ------------------------------------------------------------------------------------


def allocate(heap, num_elements: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized 1-D tensor of ``num_elements`` on ``heap``.

    Example:
        >>> flags = tensor_creation.allocate(ctx.heap, 64, torch.int32)
    """
    return _OnHeap(heap).empty(num_elements, dtype=dtype)


def parse_size(size):
    """``(size, number of elements)`` of a factory's ``*size``, one wrapping tuple or list removed at a time
    (``((2, 3),)`` gives ``(2, 3)``, ``([4, 5],)`` gives ``[4, 5]``; ``((),)`` is a scalar: one element).

    Raises:
        TypeError: a dimension is not an integer. ValueError: a dimension is negative.

    Example:
        >>> tensor_creation.parse_size(((2, 3),))
        ((2, 3), 6)
    """
    while len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = size[0]
    return size, math.prod(normalize_size(tuple(size)))


def is_valid_device(device, iris_device) -> bool:
    """Whether a factory may be given ``device`` for a heap on ``iris_device``: None; the heap's device;
    its type without an index; or ``"cuda"`` (also ``"cuda:N"`` of the heap's GPU) on every backend.

    Example:
        >>> tensor_creation.is_valid_device("cuda", torch.device("cuda:0"))
        True
    """
    if device is None:
        return True
    wanted = torch.device(device) if not isinstance(device, torch.device) else device
    if wanted.type == "cuda" and (iris_device.type == "cpu" or wanted.index in (None, iris_device.index)):
        return True
    return wanted == iris_device or (wanted.type == iris_device.type and wanted.index is None)


def throw_if_invalid_device(device, iris_device) -> None:
    """Raise RuntimeError where :func:`is_valid_device` says no.

    Example:
        >>> tensor_creation.throw_if_invalid_device("cuda", ctx.get_device())   # passes
    """
    if not is_valid_device(device, iris_device):
        raise RuntimeError(f"Device mismatch: device={device!r} was asked for, but the symmetric heap is on "
                           f"{iris_device}; pass device=None or 'cuda'")


def throw_if_invalid_output_tensor(heap, tensor: torch.Tensor, num_elements: int, dtype: torch.dtype) -> None:
    """Raise RuntimeError unless ``tensor`` can be a factory's ``out=``: ``num_elements`` elements of ``dtype``
    on ``heap`` (checked in that order).

    Example:
        >>> tensor_creation.throw_if_invalid_output_tensor(ctx.heap, out, 9, torch.float32)
    """
    if tensor.numel() != num_elements:
        raise RuntimeError(f"out= has {tensor.numel()} elements, but {num_elements} are required")
    if tensor.dtype != dtype:
        raise RuntimeError(f"out= has dtype {tensor.dtype}, but {dtype} is required")
    if not _is_on_heap(heap, tensor):
        raise RuntimeError("out= is not on the symmetric heap; make it with the context's factories")


def apply_layout(tensor: torch.Tensor, layout: torch.layout) -> torch.Tensor:
    """``tensor`` itself for ``torch.strided``, the only layout of heap tensors; ValueError for any other.

    Example:
        >>> tensor_creation.apply_layout(x, torch.strided) is x
        True
    """
    if layout == torch.strided:
        return tensor
    raise ValueError(f"layout={layout}: the symmetric heap holds strided tensors only")


def apply_memory_format(heap, tensor: torch.Tensor, size, memory_format: torch.memory_format,
                        input_tensor: torch.Tensor | None = None) -> torch.Tensor:
    """``tensor`` itself for ``torch.contiguous_format`` and ``torch.preserve_format``: heap tensors are
    contiguous (ValueError for another format, as the context's ``*_like`` factories).

    Example:
        >>> tensor_creation.apply_memory_format(ctx.heap, x, x.shape, torch.contiguous_format) is x
        True
    """
    if memory_format in (torch.contiguous_format, torch.preserve_format):
        return tensor
    raise ValueError(f"memory_format={memory_format}: heap tensors are contiguous")


# -- the factories ----------------------------------------------------------------------------------------


def zeros(heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
    """Zeros on the heap, like ``ctx.zeros(size, ...)``.

    Example:
        >>> tensor_creation.zeros(ctx.heap, ctx.get_device(), (2, 3))
    """
    return _factories(heap, iris_device, device).zeros(size, out=out, dtype=dtype, layout=layout, device=device,
                                                        requires_grad=requires_grad)


def ones(heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
    """Ones on the heap, like ``ctx.ones(size, ...)``.

    Example:
        >>> tensor_creation.ones(ctx.heap, ctx.get_device(), (4,), dtype=torch.int32)
    """
    return _factories(heap, iris_device, device).ones(size, out=out, dtype=dtype, layout=layout, device=device,
                                                       requires_grad=requires_grad)


def full(heap, iris_device, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
         requires_grad=False):
    """``fill_value`` everywhere, like ``ctx.full(size, fill_value, ...)`` (dtype inferred from it as torch does).

    Example:
        >>> tensor_creation.full(ctx.heap, ctx.get_device(), (5,), 3.5)
    """
    size = parse_size(size if isinstance(size, (tuple, list, torch.Size)) else (size,))[0]
    return _factories(heap, iris_device, device).full(size, fill_value, out=out, dtype=dtype, layout=layout,
                                                       device=device, requires_grad=requires_grad)


def zeros_like(heap, iris_device, input: torch.Tensor, *, dtype=None, layout=None, device=None, requires_grad=False,
               memory_format=torch.preserve_format):
    """Zeros shaped like ``input``, like ``ctx.zeros_like(input, ...)``.

    Example:
        >>> tensor_creation.zeros_like(ctx.heap, ctx.get_device(), x)
    """
    return _factories(heap, iris_device, device).zeros_like(input, dtype=dtype, layout=layout, device=device,
                                                             requires_grad=requires_grad, memory_format=memory_format)


def empty(heap, iris_device, size, *, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False,
          memory_format=torch.contiguous_format):
    """Uninitialized, like ``ctx.empty(size, ...)``.

    Example:
        >>> tensor_creation.empty(ctx.heap, ctx.get_device(), (4, 4))
    """
    apply_memory_format(heap, None, size, memory_format)
    return _factories(heap, iris_device, device).empty(size, out=out, dtype=dtype, layout=layout, device=device,
                                                        requires_grad=requires_grad)


def uniform(heap, iris_device, size, low=0.0, high=1.0, dtype=torch.float):
    """Uniform in [low, high), like ``ctx.uniform(size, low, high, dtype)``.

    Example:
        >>> tensor_creation.uniform(ctx.heap, ctx.get_device(), (64,), -1.0, 1.0)
    """
    size = parse_size(size if isinstance(size, (tuple, list, torch.Size)) else (size,))[0]
    return _OnHeap(heap).uniform(size, low, high, dtype)


def randn(heap, iris_device, size, *, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
          requires_grad=False):
    """Standard normal, like ``ctx.randn(size, ...)``.

    Example:
        >>> tensor_creation.randn(ctx.heap, ctx.get_device(), (64, 64), dtype=torch.bfloat16)
    """
    return _factories(heap, iris_device, device).randn(size, generator=generator, out=out, dtype=dtype,
                                                        layout=layout, device=device, requires_grad=requires_grad)


def rand(heap, iris_device, size, *, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
         requires_grad=False):
    """Uniform in [0, 1), like ``ctx.rand(size, ...)``.

    Example:
        >>> tensor_creation.rand(ctx.heap, ctx.get_device(), (128,))
    """
    return _factories(heap, iris_device, device).rand(size, generator=generator, out=out, dtype=dtype,
                                                       layout=layout, device=device, requires_grad=requires_grad)


def randint(heap, iris_device, low, high, size, *, generator=None, out=None, dtype=None, layout=torch.strided,
            device=None, requires_grad=False):
    """Integers in [low, high) (int64 by default), like ``ctx.randint(low, high, size, ...)``.

    Example:
        >>> tensor_creation.randint(ctx.heap, ctx.get_device(), 0, 10, (4, 4))
    """
    size = parse_size(size if isinstance(size, (tuple, list, torch.Size)) else (size,))[0]
    return _factories(heap, iris_device, device).randint(low, high, size, generator=generator, out=out, dtype=dtype,
                                                          layout=layout, device=device, requires_grad=requires_grad)


def arange(heap, iris_device, start, end, step, *, out=None, dtype=None, layout=torch.strided, device=None,
           requires_grad=False):
    """``start``, ``start + step``, ... up to ``end`` (excluded), like ``ctx.arange(start, end, step, ...)``.

    Example:
        >>> tensor_creation.arange(ctx.heap, ctx.get_device(), 0, 10, 2)
    """
    return _factories(heap, iris_device, device).arange(start, end, step, out=out, dtype=dtype, layout=layout,
                                                         device=device, requires_grad=requires_grad)


def linspace(heap, iris_device, start, end, steps, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False):
    """``steps`` values from ``start`` to ``end``, like ``ctx.linspace(start, end, steps, ...)``.

    Example:
        >>> tensor_creation.linspace(ctx.heap, ctx.get_device(), 0.0, 1.0, 5)
    """
    if isinstance(steps, (tuple, list, torch.Size)):
        steps = parse_size(steps)[1]
    return _factories(heap, iris_device, device).linspace(start, end, steps, out=out, dtype=dtype, layout=layout,
                                                           device=device, requires_grad=requires_grad)
