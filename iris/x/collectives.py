"""Tile collectives for user kernels: each call moves or reduces one tile, inside the caller's ``@triton.jit``
kernel, between the ranks of the device context ``ctx`` (``iris.DeviceContext.initialize(...)``).

Readiness is the caller's, by flags on the heap (``locks``: one int32 word per tile, zeroed before use): a rank
stores its tile where the others read it (``src_view``) and marks it ready (:func:`publish_tile`, or
``tl.store`` then :func:`mark_tile_ready`); the collectives that read a peer's partial (the one_shot and
two_shot all-reduces, reduce_scatter) wait for its flag first (:func:`wait_tile_ready`). The pulling
collectives (all_gather, all_to_all, broadcast) read what is there: order them after the producers with a
flag or a barrier. The pushing ones (all_reduce_atomic, all_reduce_spinlock, two_shot's results) are
complete on every rank after the caller's next barrier (``ctx.device_barrier()`` on the host).

A program that waits on a peer's flag must not depend on programs of its own launch that may not be running:
launch at most as many programs as the GPU holds at once (a persistent grid), as the fused ops do.

Example (a GEMM whose epilogue all-reduces its tile, one_shot):
    >>> @triton.jit
    ... def gemm_all_reduce(a, b, partial, out, locks, context, M, N, K, rank: tl.constexpr, world: tl.constexpr,
    ...                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    ...     ctx = iris.DeviceContext.initialize(context, rank, world)
    ...     pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    ...     acc = ...  # the tile's tl.dot sum over K
    ...     tile = iris.x.Tile(pid_m, pid_n, BM, BN, acc)
    ...     src = iris.x.make_tensor_view(partial, M, N, N, 1)
    ...     dst = iris.x.make_tensor_view(out, M, N, N, 1)
    ...     iris.x.publish_tile(tile, src, locks, ctx)
    ...     iris.x.all_reduce_one_shot(tile, src, dst, locks, ctx)
"""

import triton
import triton.language as tl

from iris.device import atomics, rma
from iris.device.rma import as_element


@triton.jit
def _tile_id(tile, view):
    return tile.pid_m * tl.cdiv(view.N, tile.block_n) + tile.pid_n


@triton.jit
def _accumulator(data):
    """``data`` in the type sums are kept in: float32 for 16-bit floats."""
    if data.dtype == tl.float16 or data.dtype == tl.bfloat16:
        acc = data.to(tl.float32)
    else:
        acc = data
    return acc


@triton.jit
def mark_tile_ready(locks, tile_id, value=1):
    """Set this rank's flag of tile ``tile_id`` to ``value`` (release, system scope): every store the program
    made before it is visible to a rank that sees the flag."""
    tl.debug_barrier()  # every thread's stores before the flag
    tl.atomic_xchg(locks + tile_id, as_element(value, locks), sem="release", scope="sys")


@triton.jit
def wait_tile_ready(locks, tile_id, from_rank, ctx, value=1):
    """Spin until rank ``from_rank``'s flag of tile ``tile_id`` is at least ``value`` (acquire, system scope)."""
    flag = locks + tile_id
    seen = atomics.atomic_add(flag, 0, ctx.rank, from_rank, ctx.heap_bases, sem="acquire", scope="sys")
    while seen < value:
        seen = atomics.atomic_add(flag, 0, ctx.rank, from_rank, ctx.heap_bases, sem="acquire", scope="sys")
    tl.debug_barrier()  # the acquire before any thread reads the tile


@triton.jit
def publish_tile(tile, src_view, locks, ctx, value=1):
    """Store ``tile.data`` into this rank's ``src_view`` at the tile and mark it ready for the other ranks."""
    ptrs, mask = src_view.tile_ptr(tile)
    tl.store(ptrs, tile.data.to(src_view.ptr.dtype.element_ty), mask=mask)
    mark_tile_ready(locks, _tile_id(tile, src_view), value)


@triton.jit
def all_gather(tile, src_view, dst_view, dim: tl.constexpr, ctx):
    """This tile of every rank's ``src_view`` (M x N) into this rank's ``dst_view``: rank r's at rows
    [r*M, (r+1)*M) with ``dim`` 0 ((W*M) x N output), at columns [r*N, (r+1)*N) with ``dim`` 1."""
    src_ptrs, mask = src_view.tile_ptr(tile)
    for r in tl.static_range(ctx.world_size):
        if dim == 0:
            dst_ptrs, dst_mask = dst_view.offset_tile_ptr(tile, offset_m=r * src_view.M, src_mask=mask)
        else:
            dst_ptrs, dst_mask = dst_view.offset_tile_ptr(tile, offset_n=r * src_view.N, src_mask=mask)
        data = rma.load(src_ptrs, ctx.rank, r, ctx.heap_bases, mask=mask)
        tl.store(dst_ptrs, data, mask=dst_mask)


@triton.jit
def broadcast(tile, src_view, dst_view, root, ctx):
    """This tile of rank ``root``'s ``src_view`` into this rank's ``dst_view``."""
    src_ptrs, mask = src_view.tile_ptr(tile)
    dst_ptrs, _ = dst_view.tile_ptr(tile)
    tl.store(dst_ptrs, rma.load(src_ptrs, ctx.rank, root, ctx.heap_bases, mask=mask), mask=mask)


@triton.jit
def all_reduce_atomic(tile, dst_view, ctx):
    """Add ``tile.data`` into the tile of every rank's ``dst_view`` (zeroed beforehand) with atomics; the sums
    are complete after the caller's next barrier."""
    ptrs, mask = dst_view.tile_ptr(tile)
    for r in tl.static_range(ctx.world_size):
        atomics.atomic_add(ptrs, tile.data.to(dst_view.ptr.dtype.element_ty), ctx.rank, r, ctx.heap_bases,
                           mask=mask)


@triton.jit
def all_reduce_spinlock(tile, dst_view, locks, ctx):
    """Add ``tile.data`` into the tile of every rank's ``dst_view`` (zeroed beforehand) under that rank's lock
    of the tile (``locks``: zeroed): read, add, write back. Complete after the caller's next barrier."""
    ptrs, mask = dst_view.tile_ptr(tile)
    lock = locks + _tile_id(tile, dst_view)
    for i in tl.static_range(ctx.world_size):
        r = (ctx.rank + i) % ctx.world_size  # ranks start on different peers
        while atomics.atomic_cas(lock, 0, 1, ctx.rank, r, ctx.heap_bases, sem="acquire", scope="sys") != 0:
            pass
        tl.debug_barrier()
        current = rma.load(ptrs, ctx.rank, r, ctx.heap_bases, mask=mask, volatile=True)
        total = _accumulator(current) + _accumulator(tile.data)
        rma.store(ptrs, total.to(dst_view.ptr.dtype.element_ty), ctx.rank, r, ctx.heap_bases, mask=mask)
        tl.debug_barrier()
        atomics.atomic_xchg(lock, 0, ctx.rank, r, ctx.heap_bases, sem="release", scope="sys")


@triton.jit
def _sum_of_peers(tile, src_view, locks, ctx, value):
    """``tile.data`` plus every other rank's published tile of ``src_view`` (each once its flag says so)."""
    src_ptrs, mask = src_view.tile_ptr(tile)
    tile_id = _tile_id(tile, src_view)
    acc = _accumulator(tile.data)
    for i in tl.static_range(1, ctx.world_size):
        r = (ctx.rank + i) % ctx.world_size
        wait_tile_ready(locks, tile_id, r, ctx, value)
        acc += _accumulator(rma.load(src_ptrs, ctx.rank, r, ctx.heap_bases, mask=mask))
    return acc


@triton.jit
def all_reduce_one_shot(tile, src_view, dst_view, locks, ctx, value=1):
    """The sum over ranks of the tile into this rank's ``dst_view``: ``tile.data`` plus every other rank's
    tile of ``src_view``, read once its flag in ``locks`` reaches ``value`` (:func:`publish_tile`)."""
    dst_ptrs, mask = dst_view.tile_ptr(tile)
    tl.store(dst_ptrs, _sum_of_peers(tile, src_view, locks, ctx, value).to(dst_view.ptr.dtype.element_ty), mask=mask)


@triton.jit
def all_reduce_two_shot(tile, src_view, dst_view, locks, start_tile, stride, ctx, value=1):
    """As :func:`all_reduce_one_shot`, but only the rank whose tiles are ``start_tile``, ``start_tile +
    stride``, ... reduces this tile, and stores the sum into every rank's ``dst_view``; complete everywhere after
    the caller's next barrier. The ranks' (start_tile, stride) must cover every tile once (rank, world)."""
    tile_id = _tile_id(tile, dst_view)
    if (tile_id >= start_tile) & ((tile_id - start_tile) % stride == 0):
        total = _sum_of_peers(tile, src_view, locks, ctx, value).to(dst_view.ptr.dtype.element_ty)
        dst_ptrs, mask = dst_view.tile_ptr(tile)
        for i in tl.static_range(ctx.world_size):
            rma.store(dst_ptrs, total, ctx.rank, (ctx.rank + i) % ctx.world_size, ctx.heap_bases, mask=mask)


@triton.jit
def reduce_scatter(tile, src_view, dst_view, locks, ctx, value=1):
    """The sum over ranks of the tile into this rank's ``dst_view``, for the tiles this rank owns: a
    contiguous share of the tile numbers (row-major), total // world each, the last rank the rest. Other
    tiles are left alone."""
    total_tiles = src_view.number_of_tiles(tile.block_m, tile.block_n)
    per_rank = total_tiles // ctx.world_size
    start = ctx.rank * per_rank
    end = total_tiles if ctx.rank == ctx.world_size - 1 else start + per_rank
    tile_id = _tile_id(tile, src_view)
    if (tile_id >= start) & (tile_id < end):
        dst_ptrs, mask = dst_view.tile_ptr(tile)
        tl.store(dst_ptrs, _sum_of_peers(tile, src_view, locks, ctx, value).to(dst_view.ptr.dtype.element_ty),
                 mask=mask)


@triton.jit
def all_to_all(tile, src_view, dst_view, N_per_rank, ctx):
    """This rank's output tile of an all_to_all by column blocks (the ccl layout): columns [s*N, (s+1)*N) of
    ``dst_view`` hold rank s's columns [rank*N, (rank+1)*N) of ``src_view`` (N = ``N_per_rank``)."""
    rm, rn = tile.indices()
    dst_ptrs, dst_mask = dst_view.tile_ptr_from_indices(rm, rn, tile.block_m, tile.block_n)
    for s in tl.static_range(ctx.world_size):
        inside = (rn >= s * N_per_rank) & (rn < (s + 1) * N_per_rank)
        src_ptrs, src_mask = src_view.tile_ptr_from_indices(rm, rn + (ctx.rank - s) * N_per_rank, tile.block_m,
                                                            tile.block_n)
        mask = dst_mask & src_mask & inside[None, :]
        tl.store(dst_ptrs, rma.load(src_ptrs, ctx.rank, s, ctx.heap_bases, mask=mask), mask=mask)
