"""Tiles and views for iris.x: where a tile of a 2-D tensor lies, as pointers and a mask.

Three plain device functions (``tile_layout``, ``tile_ptr``, ``offset_ptr``) and the aggregates built
inside a kernel: ``TileView`` (a tile's coordinates and compile-time block sizes), ``Tile`` (the same with the
tile's data, a block computed in registers: what a GEMM's epilogue holds), ``TensorView`` (a pointer with
its sizes and strides; make one with ``make_tensor_view``, which accepts compile-time sizes too) and
``AllReduceConfig`` (which all-reduce ``ctx.all_reduce`` runs, with its flags).

Example (inside a ``@triton.jit`` kernel):
    >>> tile = iris.x.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
    >>> view = iris.x.make_tensor_view(c_ptr, M, N, stride_cm, stride_cn)
    >>> ptrs, mask = view.tile_ptr(tile)
"""

import triton
import triton.language as tl
from triton.language.core import _aggregate as aggregate

from iris.device.context import bind_methods


@triton.jit
def tile_layout(pid_m, pid_n, M, N, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """(rows, columns, mask) of tile (``pid_m``, ``pid_n``) of an M x N tensor: the rows and columns it
    covers (BLOCK_SIZE_M and BLOCK_SIZE_N of them) and which of its elements lie inside the tensor."""
    rm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    rm = tl.max_contiguous(tl.multiple_of(rm, BLOCK_SIZE_M), BLOCK_SIZE_M)
    rn = tl.max_contiguous(tl.multiple_of(rn, BLOCK_SIZE_N), BLOCK_SIZE_N)
    return rm, rn, (rm[:, None] < M) & (rn[None, :] < N)


@triton.jit
def tile_ptr(ptr, M, N, stride_m, stride_n, pid_m, pid_n, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """(pointers, mask) of tile (``pid_m``, ``pid_n``) of the M x N tensor at ``ptr``: a block of pointers for
    ``tl.load``/``tl.store`` here or ``iris.load``/``iris.store`` on another rank."""
    rm, rn, mask = tile_layout(pid_m, pid_n, M, N, BLOCK_SIZE_M, BLOCK_SIZE_N)
    offsets = rm.to(tl.int64)[:, None] * stride_m + rn.to(tl.int64)[None, :] * stride_n
    return ptr + offsets, mask


@triton.jit
def offset_ptr(ptr, stride_m, stride_n, offset_m, offset_n):
    """``ptr`` moved by ``offset_m`` rows and ``offset_n`` columns."""
    return ptr + tl.cast(offset_m, tl.int64) * stride_m + tl.cast(offset_n, tl.int64) * stride_n


class _TileView:
    """A tile's coordinates (runtime) and block sizes (compile time)."""

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr

    def __init__(self, pid_m, pid_n, block_m, block_n):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)

    __init__.__triton_builtin__ = True  # runs at compile time, as Triton's own aggregate constructors do

    @triton.jit
    def layout(self, M, N):
        """(rows, columns, mask) of this tile in an M x N tensor (:func:`tile_layout`)."""
        return tile_layout(self.pid_m, self.pid_n, M, N, self.block_m, self.block_n)

    @triton.jit
    def indices(self):
        """(rows, columns) this tile covers, unmasked."""
        return (self.pid_m * self.block_m + tl.arange(0, self.block_m),
                self.pid_n * self.block_n + tl.arange(0, self.block_n))


class _Tile:
    """A tile's coordinates, block sizes and data (a block_m x block_n block, e.g. a GEMM's accumulator)."""

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr
    data: tl.tensor

    def __init__(self, pid_m, pid_n, block_m, block_n, data):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)
        self.data = data

    __init__.__triton_builtin__ = True

    layout = _TileView.layout  # the same methods as TileView's (aggregates cannot inherit from a plain class)
    indices = _TileView.indices


class _TensorView:
    """A 2-D tensor: its pointer, sizes and strides (runtime values)."""

    ptr: tl.tensor
    M: tl.tensor
    N: tl.tensor
    stride_m: tl.tensor
    stride_n: tl.tensor

    def __init__(self, ptr, M, N, stride_m, stride_n):
        self.ptr = ptr
        self.M = M
        self.N = N
        self.stride_m = stride_m
        self.stride_n = stride_n

    __init__.__triton_builtin__ = True

    @triton.jit
    def tile_ptr(self, tile):
        """(pointers, mask) of ``tile`` (a Tile or TileView) in this tensor."""
        return tile_ptr(self.ptr, self.M, self.N, self.stride_m, self.stride_n, tile.pid_m, tile.pid_n, tile.block_m,
                        tile.block_n)

    @triton.jit
    def tile_ptr_from_indices(self, rm, rn, block_m: tl.constexpr, block_n: tl.constexpr):
        """(pointers, mask) of the block at rows ``rm`` and columns ``rn``."""
        mask = (rm[:, None] < self.M) & (rn[None, :] < self.N)
        offsets = rm.to(tl.int64)[:, None] * self.stride_m + rn.to(tl.int64)[None, :] * self.stride_n
        return self.ptr + offsets, mask

    @triton.jit
    def offset_tile_ptr(self, tile, offset_m=0, offset_n=0, src_mask=None):
        """(pointers, mask) of ``tile`` moved by ``offset_m`` rows and ``offset_n`` columns; the mask also
        ``src_mask``'s when given."""
        rm, rn = tile.indices()
        ptrs, mask = self.tile_ptr_from_indices(rm + offset_m, rn + offset_n, tile.block_m, tile.block_n)
        if src_mask is not None:
            mask = mask & src_mask
        return ptrs, mask

    @triton.jit
    def number_of_tiles(self, block_m: tl.constexpr, block_n: tl.constexpr):
        """How many block_m x block_n tiles cover the tensor."""
        return tl.cdiv(self.M, block_m) * tl.cdiv(self.N, block_n)


#: the variants of ``ctx.all_reduce``, by name and by number (``variant_code``)
ALL_REDUCE_VARIANTS = {"atomic": 0, "ring": 1, "one_shot": 2, "two_shot": 3, "spinlock": 4}


class _AllReduceConfig:
    """Which all-reduce ``ctx.all_reduce`` runs (``variant_code``: 0 atomic, 1 ring, 2 one_shot, 3 two_shot,
    4 spinlock; give the number or the name) and its flags (``locks_ptr``: one int32 word per tile, zeroed;
    spinlock needs them, one_shot and two_shot wait on them when given, the others ignore them).

    Example (inside a ``@triton.jit`` kernel):
        >>> config = iris.x.AllReduceConfig("spinlock", locks)  # or AllReduceConfig(4, locks)
        >>> ctx.all_reduce(tile, src_view, dst_view, config=config)
    """

    variant_code: tl.constexpr
    locks_ptr: tl.core.base_value  # a pointer, a tensor, or None
    has_locks: tl.constexpr

    def __init__(self, variant, locks_ptr=None):
        variant = tl.core._unwrap_if_constexpr(variant)
        code = ALL_REDUCE_VARIANTS.get(variant, variant)
        if code not in ALL_REDUCE_VARIANTS.values():
            raise ValueError(f"AllReduceConfig: unknown variant {variant!r}; one of {ALL_REDUCE_VARIANTS}")
        self.variant_code = tl.constexpr(code)
        self.has_locks = tl.constexpr(tl.core._unwrap_if_constexpr(locks_ptr) is not None)
        self.locks_ptr = locks_ptr if self.has_locks else tl.constexpr(None)

    __init__.__triton_builtin__ = True


TileView = aggregate(_TileView)
Tile = aggregate(_Tile)
TensorView = aggregate(_TensorView)
AllReduceConfig = aggregate(_AllReduceConfig)
bind_methods(TileView, _TileView)
bind_methods(Tile, _Tile)
bind_methods(TensorView, _TensorView)


@triton.jit
def make_tensor_view(ptr, M, N, stride_m, stride_n):
    """A :class:`TensorView` of the M x N tensor at ``ptr`` (sizes and strides may be compile-time values)."""
    return TensorView(ptr, M + tl.zeros((), tl.int32), N + tl.zeros((), tl.int32),
                      stride_m + tl.zeros((), tl.int64), stride_n + tl.zeros((), tl.int64))
