"""GEMM + communication, a tile at a time, for a user's persistent kernel: each call computes one output tile of a
matrix product and moves it (or gathers its operand) between the ranks of the device context ``ctx``, with
ROCm/iris's names. Readiness works as in :mod:`iris.x.collectives`: ``locks`` holds one zeroed int32 flag per tile,
and a program that waits on a peer's flag must not depend on programs of its launch that may not be running
(launch a persistent grid, or one program per tile that fits on the device).

=====================  ======================================================================================
call                   what the tile becomes
=====================  ======================================================================================
``gemm_all_reduce``    sum over ranks of ``a_r @ b_r`` into this rank's ``dst_view`` (the partials published
                       in ``partial_view``, read by every rank: one-shot)
``gemm_reduce_scatter``  the same sum, stored only by the rank that owns the tile (:func:`reduce_scatter`'s split)
``gemm_all_gather``    this rank's ``a @ b`` into its block of every rank's ``dst_view`` (complete after a barrier)
``all_gather_gemm``    ``[a_0 | a_1 | ...] @ b``, each rank's column shard of ``a`` read where it lies; returned
=====================  ======================================================================================

Example (inside a ``@triton.jit`` kernel; every rank calls it for the same tiles):
    >>> tile = iris.x.TileView(pid_m, pid_n, BM, BN)
    >>> iris.x.gemm_all_reduce(tile, a_view, b_view, partial_view, out_view, locks, ctx, BK)
"""

import triton
import triton.language as tl

from iris.device import rma
from iris.device.context import DeviceContext, bind_methods
from iris.ops.gemm import dot
from iris.x.collectives import _all_gather_push, all_reduce_one_shot, publish_tile, reduce_scatter
from iris.x.core import Tile


@triton.jit
def _product(acc, a_view, b_view, rows, cols, k_first, owner, ctx, REMOTE: tl.constexpr, UPCAST: tl.constexpr,
             BLOCK_K: tl.constexpr):
    """``acc`` plus ``a_view[rows, :] @ b_view[k_first:k_first + a_view.N, cols]``, ``a_view`` read in rank
    ``owner``'s heap when REMOTE (float32; rows, columns and K past the views read as zeros)."""
    ks = tl.arange(0, BLOCK_K)
    for k in range(0, tl.cdiv(a_view.N, BLOCK_K)):
        kk = k * BLOCK_K + ks
        a_ptrs = a_view.ptr + rows[:, None].to(tl.int64) * a_view.stride_m + kk[None, :].to(tl.int64) * a_view.stride_n
        a_mask = (rows[:, None] < a_view.M) & (kk[None, :] < a_view.N)
        if REMOTE:
            x = rma.load(a_ptrs, ctx.rank, owner, ctx.heap_bases, mask=a_mask, other=0.0)
        else:
            x = tl.load(a_ptrs, mask=a_mask, other=0.0)
        b_rows = k_first + kk
        y = tl.load(b_view.ptr + b_rows[:, None].to(tl.int64) * b_view.stride_m
                    + cols[None, :].to(tl.int64) * b_view.stride_n,
                    mask=(kk[:, None] < a_view.N) & (b_rows[:, None] < b_view.M) & (cols[None, :] < b_view.N),
                    other=0.0)
        acc = dot(x, y, acc, UPCAST)
    return acc


@triton.jit
def gemm_tile(tile, a_view, b_view, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr = False):
    """The :class:`~iris.x.Tile` (float32 data) of ``a_view @ b_view`` at ``tile`` (a TileView or Tile); K is
    ``a_view.N``. ``UPCAST``: 16-bit operands as float32 (the CPU backend's interpreter needs it for bfloat16).
    Example: ``t = iris.x.gemm_tile(iris.x.TileView(pid_m, pid_n, BM, BN), a_view, b_view, BK)``."""
    rows, cols = tile.indices()
    acc = tl.zeros((tile.block_m, tile.block_n), dtype=tl.float32)
    acc = _product(acc, a_view, b_view, rows, cols, 0, 0, None, False, UPCAST, BLOCK_K)
    return Tile(tile.pid_m, tile.pid_n, tile.block_m, tile.block_n, acc)


@triton.jit
def gemm_all_reduce(tile, a_view, b_view, partial_view, dst_view, locks, ctx, BLOCK_K: tl.constexpr, value=1,
                    UPCAST: tl.constexpr = False):
    """This rank's ``a_view @ b_view`` tile published in its ``partial_view`` (heap, alike on every rank; flag in
    ``locks`` set to ``value``), then the sum over ranks of that tile into this rank's ``dst_view``: a K-split
    (row-parallel) product, all-reduced in the GEMM's epilogue.
    Example: ``iris.x.gemm_all_reduce(tile, a, b, partial, out, locks, ctx, BK)``."""
    product = gemm_tile(tile, a_view, b_view, BLOCK_K, UPCAST)
    publish_tile(product, partial_view, locks, ctx, value)
    all_reduce_one_shot(product, partial_view, dst_view, locks, ctx, value)


@triton.jit
def gemm_reduce_scatter(tile, a_view, b_view, partial_view, dst_view, locks, ctx, BLOCK_K: tl.constexpr, value=1,
                        UPCAST: tl.constexpr = False):
    """As :func:`gemm_all_reduce`, but the sum is stored only by the rank that owns the tile (a contiguous share of
    the row-major tile numbers, :func:`~iris.x.reduce_scatter`); every rank still publishes its partial.
    Example: ``iris.x.gemm_reduce_scatter(tile, a, b, partial, out, locks, ctx, BK)``."""
    product = gemm_tile(tile, a_view, b_view, BLOCK_K, UPCAST)
    publish_tile(product, partial_view, locks, ctx, value)
    reduce_scatter(product, partial_view, dst_view, locks, ctx, value)


@triton.jit
def gemm_all_gather(tile, a_view, b_view, dst_view, dim: tl.constexpr, ctx, BLOCK_K: tl.constexpr,
                    UPCAST: tl.constexpr = False):
    """This rank's ``a_view @ b_view`` tile into its block of every rank's ``dst_view`` (heap): rank r's rows
    [r*M, (r+1)*M) with ``dim`` 0, its columns with ``dim`` 1; complete after the caller's next barrier.
    Example: ``iris.x.gemm_all_gather(tile, a, b, out, 0, ctx, BK)``."""
    _all_gather_push(gemm_tile(tile, a_view, b_view, BLOCK_K, UPCAST), dst_view, dim, ctx)


@triton.jit
def all_gather_gemm(tile, a_view, b_view, ctx, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr = False):
    """The tile of ``[a_0 | a_1 | ... ] @ b_view``, returned as a :class:`~iris.x.Tile` (float32): ``a_view`` is
    this rank's column shard (M x K/W, on the heap alike on every rank: rank r's holds columns [r*K/W, (r+1)*K/W)),
    read in each rank's heap as the product needs it, with no gathered copy; ``b_view`` is the whole K x N. The
    shards must be in place before the call (written before the launch, or a barrier since).
    Example: ``t = iris.x.all_gather_gemm(tile, a_shard, b, ctx, BK); tl.store(ptrs, t.data, mask)``."""
    rows, cols = tile.indices()
    acc = tl.zeros((tile.block_m, tile.block_n), dtype=tl.float32)
    for i in tl.static_range(ctx.world_size):
        owner = (ctx.rank + i) % ctx.world_size  # ranks start on different peers
        acc = _product(acc, a_view, b_view, rows, cols, owner * a_view.N, owner, ctx, True, UPCAST, BLOCK_K)
    return Tile(tile.pid_m, tile.pid_n, tile.block_m, tile.block_n, acc)


class _ContextGemms:
    """The GEMM tile ops as methods of the device context (``ctx`` filled in), added to ``iris.DeviceContext``
    by importing iris.x. Example: ``ctx.gemm_all_reduce(tile, a, b, partial, out, locks, BK)``."""

    @triton.jit
    def gemm_all_reduce(self, tile, a_view, b_view, partial_view, dst_view, locks, BLOCK_K: tl.constexpr, value=1,
                        UPCAST: tl.constexpr = False):
        """:func:`gemm_all_reduce`. Example: ``ctx.gemm_all_reduce(tile, a, b, partial, out, locks, BK)``."""
        gemm_all_reduce(tile, a_view, b_view, partial_view, dst_view, locks, self, BLOCK_K, value, UPCAST)

    @triton.jit
    def gemm_reduce_scatter(self, tile, a_view, b_view, partial_view, dst_view, locks, BLOCK_K: tl.constexpr,
                            value=1, UPCAST: tl.constexpr = False):
        """:func:`gemm_reduce_scatter`. Example: ``ctx.gemm_reduce_scatter(tile, a, b, partial, out, locks, BK)``."""
        gemm_reduce_scatter(tile, a_view, b_view, partial_view, dst_view, locks, self, BLOCK_K, value, UPCAST)

    @triton.jit
    def gemm_all_gather(self, tile, a_view, b_view, dst_view, dim: tl.constexpr, BLOCK_K: tl.constexpr,
                        UPCAST: tl.constexpr = False):
        """:func:`gemm_all_gather`. Example: ``ctx.gemm_all_gather(tile, a, b, out, 0, BK)``."""
        gemm_all_gather(tile, a_view, b_view, dst_view, dim, self, BLOCK_K, UPCAST)

    @triton.jit
    def all_gather_gemm(self, tile, a_view, b_view, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr = False):
        """:func:`all_gather_gemm`. Example: ``t = ctx.all_gather_gemm(tile, a_shard, b, BK)``."""
        return all_gather_gemm(tile, a_view, b_view, self, BLOCK_K, UPCAST)


bind_methods(DeviceContext, _ContextGemms)
