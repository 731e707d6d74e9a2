"""Iris's collectives and fused ops as torch custom ops, ``torch.ops.iris.<name>``, for ``torch.compile``.

Each op is registered with :func:`torch.library.custom_op` and a fake (shape-only) implementation, so
``torch.compile(fullgraph=True)`` traces a function that calls it as one node, with no graph break, and
CUDA-graph capture (``mode="reduce-overhead"``) records its launches. The ops act on the context given to
:func:`set_context`:

=========================================  ==============================================================
``all_reduce(input, op="sum")``            the sum (``"max"``, ``"min"``) over ranks, ``input``'s shape
``all_reduce_(input, op="sum")``           the same, in place (returns nothing)
``all_gather(input)``                      every rank's ``input`` stacked along dim 0: (W * M, ...)
``reduce_scatter(input, op="sum")``        ``input``'s shape: this rank's tiles of the sum, as
                                           ``ctx.ccl.reduce_scatter`` with a same-shape output (zeros
                                           elsewhere)
``reduce_scatter_tensor(input, op="sum")`` torch's layout: rows ``[r * M / W, (r + 1) * M / W)`` of the sum
``all_to_all(input)``                      (M, W * N) in and out: chunk ``j`` of rank ``i`` to chunk ``i``
                                           of rank ``j``
``broadcast(input, src=0)``                rank ``src``'s ``input`` on every rank
``all_reduce_rmsnorm(partial, residual,    ``(out, residual + the sum of partial)``, out its RMSNorm times
weight, eps=1e-6)``                        ``weight`` (``ctx.ccl.all_reduce_rmsnorm``, functional)
``matmul_all_reduce(A, B, bias=None)``     and the other fused ops of ``ctx.ops`` (``matmul_reduce_scatter``,
                                           ``all_gather_matmul``, ``matmul_all_gather``,
                                           ``gemm_all_scatter``): their output, in A's dtype
=========================================  ==============================================================

Tensors another rank reads must be on the symmetric heap. An input that is not, where the variant for its
size reads it on its own rank only (all_reduce's push and ll, the small sizes), is read where it is; else it
is copied into a heap buffer the op keeps for its (op, shape, dtype) and reuses on every later call: made on
the first call (collective: every rank makes the same calls in the same order, as with any Iris collective), so under
CUDA graphs the warm-up run makes it and capture only records copies and launches. The result is a new
tensor, never a kept buffer.

Example:
    >>> import iris, torch
    >>> ctx = iris.iris(1 << 30)
    >>> iris.compile.set_context(ctx)
    >>> @torch.compile(fullgraph=True)
    ... def layer(x, w):
    ...     return torch.ops.iris.all_reduce(x @ w)
    >>> y = layer(torch.randn(8, 64, device=ctx.get_device()), torch.randn(64, 64, device=ctx.get_device()))
"""

from __future__ import annotations

import functools
import weakref
from typing import Optional

import torch

from iris.ccl.all_reduce import all_reduce_to_new, choose_variant, input_on_heap
from iris.ccl.config import CollectiveConfig, ReduceOp

_context = None  # a weak reference to the context given to set_context
_kept: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # context -> {key: heap buffer}


def set_context(ctx) -> None:
    """Make ``ctx`` the context the ``torch.ops.iris`` ops run on (call it on every rank before the first
    call or trace).

    Example:
        >>> iris.compile.set_context(iris.iris(1 << 30))
    """
    from iris.context import Iris

    global _context
    if not isinstance(ctx, Iris):
        raise TypeError(f"iris.compile.set_context: expected an Iris context (iris.iris(...)), got "
                        f"{type(ctx).__name__}")
    _context = weakref.ref(ctx)  # held weakly: the context, and with it the heap, dies with its last user


def get_context():
    """The context given to :func:`set_context`; a RuntimeError naming the call to make if none was."""
    ctx = None if _context is None else _context()
    if ctx is None:
        raise RuntimeError("torch.ops.iris: no Iris context; call iris.compile.set_context(ctx) on every rank first")
    return ctx


def _kept_buffer(ctx, name: str, shape, dtype: torch.dtype) -> torch.Tensor:
    buffers = _kept.setdefault(ctx, {})
    key = (name, tuple(shape), dtype)
    if key not in buffers:
        buffers[key] = ctx.empty(tuple(shape), dtype=dtype)
    return buffers[key]


def _staged(ctx, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s copy in the heap buffer kept for ``name``, its shape and dtype."""
    return _kept_buffer(ctx, name, tensor.shape, tensor.dtype).copy_(tensor)


def _on_heap(ctx, name: str, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself if it is on the heap and contiguous; else :func:`_staged`."""
    if tensor.is_contiguous() and ctx.is_symmetric(tensor):
        return tensor
    return _staged(ctx, name, tensor)


def _in_place_off_heap_config(ctx, tensor: torch.Tensor) -> Optional[CollectiveConfig]:
    """The Config of the variant an in-place all-reduce of ``tensor`` takes, where that variant may read a
    contiguous ``tensor`` off the heap (push, ll: :func:`iris.ccl.all_reduce.input_on_heap`); else None."""
    if not tensor.is_contiguous():
        return None
    return _off_heap_config(tensor.numel() * tensor.element_size(), ctx.get_num_ranks(), tensor.dtype,
                            ctx.team.heap_reaches_by_engine)


@functools.lru_cache(maxsize=256)
def _off_heap_config(nbytes: int, world: int, dtype: torch.dtype, engine: bool) -> Optional[CollectiveConfig]:
    """:func:`_in_place_off_heap_config` by size, made once per size (every in-place call asks)."""
    variant = choose_variant(nbytes, True, world, dtype)
    return None if input_on_heap(variant, engine) else CollectiveConfig(all_reduce_variant=variant)


def _reduce_op(name: str, op: str) -> ReduceOp:
    try:
        return ReduceOp(op)
    except ValueError:
        raise ValueError(f"torch.ops.iris.{name}: op={op!r}; one of 'sum', 'max', 'min'") from None


def _world() -> int:
    return get_context().get_num_ranks()


@torch.library.custom_op("iris::all_reduce", mutates_args=())
def all_reduce(input: torch.Tensor, op: str = "sum") -> torch.Tensor:
    ctx = get_context()
    return all_reduce_to_new(input.contiguous(), ctx, lambda tensor: _staged(ctx, "all_reduce", tensor),
                             op=_reduce_op("all_reduce", op))


@all_reduce.register_fake
def _(input, op="sum"):
    return torch.empty_like(input)


@torch.library.custom_op("iris::all_reduce_", mutates_args=("input",))
def all_reduce_(input: torch.Tensor, op: str = "sum") -> None:
    ctx = get_context()
    reduce = _reduce_op("all_reduce_", op)
    if input.is_contiguous() and ctx.is_symmetric(input):
        ctx.ccl.all_reduce(input, input, op=reduce)
        return
    config = _in_place_off_heap_config(ctx, input)
    if config is not None:  # its size's variant reads the input only here: no copy
        ctx.ccl.all_reduce(input, input, op=reduce, config=config)
        return
    work = _staged(ctx, "all_reduce", input)
    ctx.ccl.all_reduce(work, work, op=reduce)
    input.copy_(work)


@all_reduce_.register_fake
def _(input, op="sum"):
    return None


def _as_2d(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(tensor.shape[0], -1) if tensor.dim() != 1 else tensor.reshape(-1, 1)


@torch.library.custom_op("iris::all_gather", mutates_args=())
def all_gather(input: torch.Tensor) -> torch.Tensor:
    ctx = get_context()
    flat = _as_2d(input)
    source = _on_heap(ctx, "all_gather.input", flat)
    out = _kept_buffer(ctx, "all_gather", (ctx.get_num_ranks() * flat.shape[0], flat.shape[1]), input.dtype)
    ctx.ccl.all_gather(out, source)
    return out.reshape(ctx.get_num_ranks() * input.shape[0], *input.shape[1:]).clone()


@all_gather.register_fake
def _(input):
    return input.new_empty((_world() * input.shape[0], *input.shape[1:]))


@torch.library.custom_op("iris::reduce_scatter", mutates_args=())
def reduce_scatter(input: torch.Tensor, op: str = "sum") -> torch.Tensor:
    ctx = get_context()
    reduce = _reduce_op("reduce_scatter", op)
    flat = _as_2d(input)
    source = _on_heap(ctx, "reduce_scatter.input", flat)
    out = _kept_buffer(ctx, "reduce_scatter", flat.shape, input.dtype).zero_()
    ctx.ccl.reduce_scatter(out, source, op=reduce)
    return out.reshape(input.shape).clone()


@reduce_scatter.register_fake
def _(input, op="sum"):
    return torch.empty_like(input)


@torch.library.custom_op("iris::reduce_scatter_tensor", mutates_args=())
def reduce_scatter_tensor(input: torch.Tensor, op: str = "sum") -> torch.Tensor:
    ctx = get_context()
    reduce = _reduce_op("reduce_scatter_tensor", op)
    world = ctx.get_num_ranks()
    if input.dim() == 0 or input.shape[0] % world:
        raise ValueError(f"torch.ops.iris.reduce_scatter_tensor: input of shape {tuple(input.shape)}; its first "
                         f"dimension must divide by the {world} ranks")
    flat = _as_2d(input)
    source = _on_heap(ctx, "reduce_scatter_tensor.input", flat)
    out = _kept_buffer(ctx, "reduce_scatter_tensor", (flat.shape[0] // world, flat.shape[1]), input.dtype)
    ctx.ccl.reduce_scatter(out, source, op=reduce)
    return out.reshape(input.shape[0] // world, *input.shape[1:]).clone()


@reduce_scatter_tensor.register_fake
def _(input, op="sum"):
    return input.new_empty((input.shape[0] // _world(), *input.shape[1:]))


@torch.library.custom_op("iris::all_to_all", mutates_args=())
def all_to_all(input: torch.Tensor) -> torch.Tensor:
    ctx = get_context()
    flat = _as_2d(input)
    source = _on_heap(ctx, "all_to_all.input", flat)
    out = _kept_buffer(ctx, "all_to_all", flat.shape, input.dtype)
    ctx.ccl.all_to_all(out, source)
    return out.reshape(input.shape).clone()


@all_to_all.register_fake
def _(input):
    return torch.empty_like(input)


@torch.library.custom_op("iris::broadcast", mutates_args=())
def broadcast(input: torch.Tensor, src: int = 0) -> torch.Tensor:
    ctx = get_context()
    work = _staged(ctx, "broadcast", input)
    ctx.ccl.broadcast(work, src=src)
    return work.clone()


@broadcast.register_fake
def _(input, src=0):
    return torch.empty_like(input)


@torch.library.custom_op("iris::all_reduce_rmsnorm", mutates_args=())
def all_reduce_rmsnorm(partial: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    ctx = get_context()
    source = _on_heap(ctx, "all_reduce_rmsnorm.partial", partial.contiguous())
    updated = residual.clone(memory_format=torch.contiguous_format)
    out = ctx.ccl.all_reduce_rmsnorm(source, updated, weight.contiguous(), eps=eps)
    return out, updated


@all_reduce_rmsnorm.register_fake
def _(partial, residual, weight, eps=1e-6):
    return torch.empty_like(partial), torch.empty_like(residual)


# The fused ops: (output shape from A (M, K), B (K, N) and the world size W, whether peers write the output).
_FUSED = {
    "matmul_all_reduce": (lambda M, N, W: (M, N), False),
    "matmul_reduce_scatter": (lambda M, N, W: (M, N // W), False),
    "all_gather_matmul": (lambda M, N, W: (M, N), False),
    "matmul_all_gather": (lambda M, N, W: (W * M, N), True),
    "gemm_all_scatter": (lambda M, N, W: (M, W * N), True),
}


def _fused(name: str, A: torch.Tensor, B: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    ctx = get_context()
    shape_of, on_heap = _FUSED[name]
    shape = shape_of(A.shape[0], B.shape[1], ctx.get_num_ranks())
    out = _kept_buffer(ctx, name, shape, A.dtype) if on_heap else torch.empty(shape, dtype=A.dtype, device=A.device)
    getattr(ctx.ops, name)(out, A, B, bias=bias)
    return out.clone() if on_heap else out


def _register_fused(name: str) -> None:
    shape_of, _ = _FUSED[name]

    def implementation(A: torch.Tensor, B: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _fused(name, A, B, bias)

    def fake(A, B, bias=None):
        return A.new_empty(shape_of(A.shape[0], B.shape[1], _world()))

    op = torch.library.custom_op(f"iris::{name}", implementation, mutates_args=())
    op.register_fake(fake)
    globals()[name] = op


for _name in _FUSED:
    _register_fused(_name)
del _name

OPS = ("all_reduce", "all_reduce_", "all_gather", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
       "broadcast", "all_reduce_rmsnorm", *_FUSED)
