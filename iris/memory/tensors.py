"""torch-like tensor factories whose results live on the symmetric heap.

They follow torch's signatures and semantics (size as varargs or one sequence,
dtype defaulting to torch's default, ``out=``, ``requires_grad``, ``generator``
where torch has one). ``device="cuda"`` means the heap's device on every backend.
"""

from __future__ import annotations

import numbers

import torch


def normalize_size(size) -> tuple[int, ...]:
    """``(2, 3)``, ``((2, 3),)``, ``([2, 3],)``, ``(torch.Size([2, 3]),)`` and ``(((2, 3),),)`` all give ``(2, 3)``.

    Raises:
        TypeError: a dimension is not an integer.
        ValueError: a dimension is negative.
    """
    while len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):  # nested at any depth
        size = tuple(size[0])
    dims = []
    for dim in size:
        if isinstance(dim, bool) or not isinstance(dim, numbers.Integral):
            raise TypeError(f"tensor size {tuple(size)!r}: dimension {dim!r} is not an integer")
        if dim < 0:
            raise ValueError(f"tensor size {tuple(size)!r}: dimension {dim} is negative")
        dims.append(int(dim))
    return tuple(dims)


class OutTensorError(ValueError, RuntimeError):
    """A factory's ``out=`` tensor that cannot hold the result: a RuntimeError, as torch raises for a bad
    ``out=``, and a ValueError, as Iris raises for every bad argument."""


class TensorFactories:
    """Mixin of the Iris context: needs ``self.heap`` (a SymmetricHeap)."""

    # -- helpers ---------------------------------------------------------------------------

    def _check_device(self, device) -> None:
        if device is None:
            return
        wanted = torch.device(device) if not isinstance(device, torch.device) else device
        heap = self.heap.device
        if wanted.type == "cuda" and (heap.type == "cpu" or wanted.index in (None, heap.index)):
            return
        if wanted == heap or (wanted.type == heap.type and wanted.index is None):
            return
        raise ValueError(f"device={device!r}: this rank's symmetric heap is on {heap}; pass device=None or 'cuda'")

    def _new(self, size, dtype, device, layout=torch.strided, out=None) -> torch.Tensor:
        """An uninitialized heap tensor (or ``out``, checked) of ``size`` and ``dtype``."""
        if layout != torch.strided:
            raise ValueError(f"layout={layout}: the symmetric heap holds strided tensors only")
        self._check_device(device)
        shape = normalize_size(size)
        if out is None:
            return self.heap.allocate(shape, dtype)
        if not self.is_symmetric(out):
            raise OutTensorError("out= must be a tensor on the symmetric heap (made by this Iris context)")
        if out.dtype != dtype:
            raise OutTensorError(f"out= has dtype {out.dtype}, the result needs {dtype}")
        if out.numel() != torch.Size(shape).numel() or not out.is_contiguous():
            raise OutTensorError(f"out= has shape {tuple(out.shape)}; it must be contiguous with "
                                 f"{torch.Size(shape).numel()} elements")
        return out if tuple(out.shape) == tuple(shape) else out.view(shape)  # out itself

    @staticmethod
    def _finish(tensor: torch.Tensor, requires_grad: bool) -> torch.Tensor:
        if requires_grad:
            tensor.requires_grad_(True)
        return tensor

    def _copy_in(self, values: torch.Tensor, out, device, requires_grad, layout=torch.strided) -> torch.Tensor:
        tensor = self._new(values.shape, values.dtype, device, layout, out)
        tensor.copy_(values)
        return self._finish(tensor, requires_grad)

    # -- factories -------------------------------------------------------------------------

    def empty(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False,
              memory_format=torch.contiguous_format):
        """Uninitialized heap tensor, like ``torch.empty``.

        Example:
            >>> buf = ctx.empty(4, 8, dtype=torch.float16)
        """
        dtype = dtype or torch.get_default_dtype()
        return self._finish(self._new(size, dtype, device, layout, out), requires_grad)

    def zeros(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
        """Heap tensor of zeros, like ``torch.zeros``.

        Example:
            >>> buf = ctx.zeros(4096, device="cuda", dtype=torch.float32)
        """
        tensor = self._new(size, dtype or torch.get_default_dtype(), device, layout, out)
        return self._finish(tensor.zero_(), requires_grad)

    def ones(self, *size, out=None, dtype=None, layout=torch.strided, device=None, requires_grad=False):
        """Heap tensor of ones, like ``torch.ones``.

        Example:
            >>> buf = ctx.ones((2, 3), dtype=torch.int32)
        """
        tensor = self._new(size, dtype or torch.get_default_dtype(), device, layout, out)
        return self._finish(tensor.fill_(1), requires_grad)

    def full(self, size, fill_value, *, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False):
        """Heap tensor filled with ``fill_value``, like ``torch.full`` (dtype inferred from it).

        Example:
            >>> buf = ctx.full((2, 3), 7)   # int64, as torch.full gives
        """
        if dtype is None:
            dtype = torch.full((), fill_value).dtype
        tensor = self._new((size,) if isinstance(size, numbers.Integral) else tuple(size), dtype, device, layout, out)
        return self._finish(tensor.fill_(fill_value), requires_grad)

    def arange(self, start=0, end=None, step=1, *, out=None, dtype=None, layout=torch.strided, device=None,
               requires_grad=False):
        """Heap tensor of evenly spaced values, like ``torch.arange``.

        Example:
            >>> idx = ctx.arange(10)          # 0..9, int64
            >>> xs = ctx.arange(0.0, 1.0, 0.25)
        """
        if end is None:
            start, end = 0, start
        if step == 0:  # ValueError (torch raises RuntimeError)
            raise ValueError("arange: step must be non-zero")
        if (end - start) * step < 0:
            raise ValueError(f"arange: upper bound and lower bound inconsistent with step sign "
                             f"(start={start}, end={end}, step={step})")
        values = torch.arange(start, end, step, dtype=dtype)
        return self._copy_in(values, out, device, requires_grad, layout)

    def linspace(self, start, end, steps, *, out=None, dtype=None, layout=torch.strided, device=None,
                 requires_grad=False):
        """Heap tensor of ``steps`` values from ``start`` to ``end``, like ``torch.linspace``.

        Example:
            >>> xs = ctx.linspace(0, 1, 5)
        """
        values = torch.linspace(start, end, steps, dtype=dtype)
        return self._copy_in(values, out, device, requires_grad, layout)

    def rand(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
             requires_grad=False):
        """Uniform [0, 1) heap tensor, like ``torch.rand``.

        Example:
            >>> g = torch.Generator(device=ctx.get_device()).manual_seed(0)
            >>> x = ctx.rand(128, generator=g)
        """
        tensor = self._new(size, dtype or torch.get_default_dtype(), device, layout, out)
        torch.rand(tensor.shape, generator=generator, dtype=tensor.dtype, device=tensor.device, out=tensor)
        return self._finish(tensor, requires_grad)

    def randn(self, *size, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
              requires_grad=False):
        """Standard normal heap tensor, like ``torch.randn``.

        Example:
            >>> x = ctx.randn(64, 64, dtype=torch.bfloat16)
        """
        tensor = self._new(size, dtype or torch.get_default_dtype(), device, layout, out)
        torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype, device=tensor.device, out=tensor)
        return self._finish(tensor, requires_grad)

    def randint(self, *args, generator=None, out=None, dtype=None, layout=torch.strided, device=None,
                requires_grad=False):
        """Integers in [low, high), like ``torch.randint(high, size)`` or ``torch.randint(low, high, size)``.

        Example:
            >>> x = ctx.randint(0, 10, (4, 4))
        """
        if len(args) == 2:
            low, (high, size) = 0, args
        elif len(args) == 3:
            low, high, size = args
        else:
            raise TypeError("randint takes (high, size) or (low, high, size)")
        tensor = self._new((size,) if isinstance(size, numbers.Integral) else tuple(size), dtype or torch.int64,
                           device, layout, out)
        torch.randint(low, high, tensor.shape, generator=generator, dtype=tensor.dtype, device=tensor.device,
                      out=tensor)
        return self._finish(tensor, requires_grad)

    def uniform(self, size, low=0.0, high=1.0, dtype=None, *, generator=None, device=None, requires_grad=False):
        """Heap tensor uniform in [low, high).

        Example:
            >>> x = ctx.uniform((16,), low=-1.0, high=1.0)
        """
        tensor = self._new((size,) if isinstance(size, numbers.Integral) else tuple(size),
                           dtype or torch.get_default_dtype(), device)
        tensor.uniform_(low, high, generator=generator)
        return self._finish(tensor, requires_grad)

    # -- *_like ----------------------------------------------------------------------------

    def _like(self, input, dtype, layout, device, memory_format):
        if memory_format not in (torch.preserve_format, torch.contiguous_format):
            raise ValueError(f"memory_format={memory_format}: heap tensors are contiguous")
        return dict(dtype=dtype or input.dtype, layout=layout or torch.strided, device=device)

    def empty_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format):
        """Like ``torch.empty_like``, on the heap."""
        return self.empty(input.shape, requires_grad=requires_grad,
                          **self._like(input, dtype, layout, device, memory_format))

    def zeros_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format):
        """Like ``torch.zeros_like``, on the heap.

        Example:
            >>> y = ctx.zeros_like(x)
        """
        return self.zeros(input.shape, requires_grad=requires_grad,
                          **self._like(input, dtype, layout, device, memory_format))

    def ones_like(self, input, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format):
        """Like ``torch.ones_like``, on the heap."""
        return self.ones(input.shape, requires_grad=requires_grad,
                         **self._like(input, dtype, layout, device, memory_format))

    def full_like(self, input, fill_value, *, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format):
        """Like ``torch.full_like``, on the heap."""
        return self.full(input.shape, fill_value, requires_grad=requires_grad,
                         **self._like(input, dtype, layout, device, memory_format))

    def rand_like(self, input, *, generator=None, dtype=None, layout=None, device=None, requires_grad=False,
                  memory_format=torch.preserve_format):
        """Like ``torch.rand_like``, on the heap."""
        return self.rand(input.shape, generator=generator, requires_grad=requires_grad,
                         **self._like(input, dtype, layout, device, memory_format))

    def randn_like(self, input, *, generator=None, dtype=None, layout=None, device=None, requires_grad=False,
                   memory_format=torch.preserve_format):
        """Like ``torch.randn_like``, on the heap."""
        return self.randn(input.shape, generator=generator, requires_grad=requires_grad,
                          **self._like(input, dtype, layout, device, memory_format))

    def randint_like(self, input, low=0, high=None, *, generator=None, dtype=None, layout=None, device=None,
                     requires_grad=False, memory_format=torch.preserve_format):
        """Like ``torch.randint_like``, on the heap."""
        if high is None:
            low, high = 0, low
        return self.randint(low, high, input.shape, generator=generator, requires_grad=requires_grad,
                            **self._like(input, dtype, layout, device, memory_format))

    # -- membership ------------------------------------------------------------------------

    def is_symmetric(self, tensor: torch.Tensor) -> bool:
        """True when ``tensor`` lies entirely inside this rank's symmetric heap.

        Example:
            >>> ctx.is_symmetric(ctx.zeros(4))   # True
            >>> ctx.is_symmetric(torch.zeros(4)) # False
        """
        return self.heap.contains(tensor)

    def as_symmetric(self, tensor: torch.Tensor) -> torch.Tensor:
        """A heap copy of ``tensor`` (same shape, dtype and values), usable from remote ranks.

        Example:
            >>> x = ctx.as_symmetric(torch.arange(8))
        """
        result = self._new(tensor.shape, tensor.dtype, None)
        result.copy_(tensor.detach())
        return self._finish(result, tensor.requires_grad)
