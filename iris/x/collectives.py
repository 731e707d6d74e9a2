"""Tile collectives for user kernels: each call moves or reduces one tile, inside the caller's ``@triton.jit``
kernel, between the ranks of the device context ``ctx`` (``iris.DeviceContext.initialize(...)``).

Readiness is the caller's, by flags on the heap (``locks``: one zeroed int32 word per tile): a rank stores its tile
where the others read it (``src_view``) and marks it ready (:func:`publish_tile`); the collectives that read a
peer's partial (one_shot, two_shot, reduce_scatter) wait for its flag (:func:`wait_tile_ready`), or with ``locks``
None read every ``src_view`` as it is. The pulling collectives read what is there (order them after the producers
by a flag or a barrier); the pushing ones (atomic, spinlock, two_shot's results) are complete after the caller's
next barrier. A program that waits on a peer's flag must not depend on programs of its launch that may not be
running: launch a persistent grid, as the fused ops do.

Example (a GEMM epilogue that all-reduces its tile):
    >>> tile = iris.x.Tile(pid_m, pid_n, BM, BN, acc)
    >>> iris.x.publish_tile(tile, src, locks, ctx)
    >>> iris.x.all_reduce_one_shot(tile, src, dst, locks, ctx)
"""

import triton
import triton.language as tl

from iris.device import atomics, rma
from iris.device.context import DeviceContext, bind_methods
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
    """Set this rank's flag of tile ``tile_id`` to ``value`` (release, system scope): the program's stores before
    it are visible to a rank that sees the flag. Example: ``iris.x.mark_tile_ready(locks, tile_id)``."""
    tl.debug_barrier()  # every thread's stores before the flag
    tl.atomic_xchg(locks + tile_id, as_element(value, locks), sem="release", scope="sys")


@triton.jit
def wait_tile_ready(locks, tile_id, from_rank, ctx, value=1):
    """Spin until rank ``from_rank``'s flag of tile ``tile_id`` is at least ``value`` (acquire, system scope).
    Example: ``iris.x.wait_tile_ready(locks, tile_id, peer, ctx)``."""
    flag = locks + tile_id
    seen = atomics.atomic_add(flag, 0, ctx.rank, from_rank, ctx.heap_bases, sem="acquire", scope="sys")
    while seen < value:
        seen = atomics.atomic_add(flag, 0, ctx.rank, from_rank, ctx.heap_bases, sem="acquire", scope="sys")
    tl.debug_barrier()  # the acquire before any thread reads the tile


@triton.jit
def publish_tile(tile, src_view, locks, ctx, value=1):
    """Store ``tile.data`` into this rank's ``src_view`` at the tile and mark it ready for the other ranks.
    Example: ``iris.x.publish_tile(tile, src_view, locks, ctx)``."""
    ptrs, mask = src_view.tile_ptr(tile)
    tl.store(ptrs, tile.data.to(src_view.ptr.dtype.element_ty), mask=mask)
    mark_tile_ready(locks, _tile_id(tile, src_view), value)


@triton.jit
def all_gather(tile, src_view, dst_view, dim: tl.constexpr, ctx):
    """This tile of every rank's ``src_view`` (M x N) into this rank's ``dst_view``: rank r's at rows [r*M, (r+1)*M)
    (``dim`` 0) or columns [r*N, (r+1)*N) (``dim`` 1). Example: ``iris.x.all_gather(tile, src, dst, 0, ctx)``."""
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
    """This tile of rank ``root``'s ``src_view`` into this rank's ``dst_view``.
    Example: ``iris.x.broadcast(tile, src_view, dst_view, 0, ctx)``."""
    src_ptrs, mask = src_view.tile_ptr(tile)
    dst_ptrs, _ = dst_view.tile_ptr(tile)
    tl.store(dst_ptrs, rma.load(src_ptrs, ctx.rank, root, ctx.heap_bases, mask=mask), mask=mask)


@triton.jit
def all_reduce_atomic(tile, dst_view, ctx):
    """Add ``tile.data`` into the tile of every rank's ``dst_view`` (zeroed beforehand) with atomics; complete after
    the caller's next barrier. Example: ``iris.x.all_reduce_atomic(tile, dst_view, ctx)``."""
    ptrs, mask = dst_view.tile_ptr(tile)
    for r in tl.static_range(ctx.world_size):
        atomics.atomic_add(ptrs, tile.data.to(dst_view.ptr.dtype.element_ty), ctx.rank, r, ctx.heap_bases,
                           mask=mask)


@triton.jit
def all_reduce_spinlock(tile, dst_view, locks, ctx, tile_id=None):
    """Add ``tile.data`` into the tile of every rank's ``dst_view`` (zeroed) under that rank's lock of the tile
    (``locks[tile_id]``, by default its row-major number): read, add, write back; complete after the caller's next
    barrier. Example: ``iris.x.all_reduce_spinlock(tile, dst_view, locks, ctx)``."""
    ptrs, mask = dst_view.tile_ptr(tile)
    if tile_id is None:
        tile_id = _tile_id(tile, dst_view)
    lock = locks + tile_id
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
    """``tile.data`` plus every other rank's published tile of ``src_view`` once its flag says so (without ``locks``,
    every rank's tile as it is), the peers read around the ring from the next rank."""
    src_ptrs, mask = src_view.tile_ptr(tile)
    if locks is None:
        acc = _accumulator(tl.load(src_ptrs, mask=mask))
    else:
        acc = _accumulator(tile.data)
    for i in tl.static_range(1, ctx.world_size):
        r = (ctx.rank + i) % ctx.world_size
        if locks is not None:
            wait_tile_ready(locks, _tile_id(tile, src_view), r, ctx, value)
        acc += _accumulator(rma.load(src_ptrs, ctx.rank, r, ctx.heap_bases, mask=mask))
    return acc


@triton.jit
def all_reduce_one_shot(tile, src_view, dst_view, locks, ctx, value=1):
    """The sum over ranks of the tile into this rank's ``dst_view``: ``tile.data`` plus every other rank's tile of
    ``src_view``, read once its flag reaches ``value`` (``locks`` None: as it is).
    Example: ``iris.x.all_reduce_one_shot(tile, src_view, dst_view, locks, ctx)`` after :func:`publish_tile`."""
    dst_ptrs, mask = dst_view.tile_ptr(tile)
    tl.store(dst_ptrs, _sum_of_peers(tile, src_view, locks, ctx, value).to(dst_view.ptr.dtype.element_ty), mask=mask)


@triton.jit
def all_reduce_ring(tile, src_view, dst_view, ctx):
    """The sum over ranks of the tile of every rank's ``src_view`` into this rank's ``dst_view``, read around the
    ring; no flags: the inputs are in place before the launch (or a barrier). ``tile`` may be a TileView.
    Example: ``iris.x.all_reduce_ring(tile, src_view, dst_view, ctx)``."""
    all_reduce_one_shot(tile, src_view, dst_view, None, ctx)


@triton.jit
def gather(tile, src_view, source_rank, ctx):
    """The tile of rank ``source_rank``'s ``src_view``, returned (not stored), to use at once.
    Example: ``acc += tl.dot(iris.x.gather(tile, a_view, r, ctx), b)``."""
    ptrs, mask = src_view.tile_ptr(tile)
    return rma.load(ptrs, ctx.rank, source_rank, ctx.heap_bases, mask=mask, other=0)


@triton.jit
def all_reduce_two_shot(tile, src_view, dst_view, locks, start_tile=None, stride=None, ctx=None, value=1):
    """As :func:`all_reduce_one_shot`, but only the rank whose tiles are ``start_tile``, ``start_tile + stride``, ...
    reduces this tile, and stores the sum into every rank's ``dst_view`` (complete after the next barrier). Called
    as ``all_reduce_two_shot(tile, src_view, dst_view, locks, ctx)``, the tiles are dealt round-robin.
    Example: ``iris.x.all_reduce_two_shot(tile, src_view, dst_view, locks, rank, world, ctx)``."""
    if ctx is None:  # (tile, src_view, dst_view, locks, ctx): the context came fifth
        ctx = start_tile
        start_tile = None
    if start_tile is None:
        start_tile = ctx.rank
        stride = ctx.world_size
    tile_id = _tile_id(tile, dst_view)
    if (tile_id >= start_tile) & ((tile_id - start_tile) % stride == 0):
        total = _sum_of_peers(tile, src_view, locks, ctx, value).to(dst_view.ptr.dtype.element_ty)
        dst_ptrs, mask = dst_view.tile_ptr(tile)
        for i in tl.static_range(ctx.world_size):
            rma.store(dst_ptrs, total, ctx.rank, (ctx.rank + i) % ctx.world_size, ctx.heap_bases, mask=mask)


@triton.jit
def reduce_scatter(tile, src_view, dst_view, locks, ctx, value=1):
    """The sum over ranks of the tile into this rank's ``dst_view`` for the tiles it owns (a contiguous share of the
    row-major tile numbers, the last rank the rest), read as :func:`all_reduce_one_shot` does.
    Example: ``iris.x.reduce_scatter(tile, src_view, dst_view, locks, ctx)``."""
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
    ``dst_view`` hold rank s's columns [rank*N, (rank+1)*N) (N = ``N_per_rank``).
    Example: ``iris.x.all_to_all(tile, src_view, dst_view, N_per_rank, ctx)``."""
    rm, rn = tile.indices()
    dst_ptrs, dst_mask = dst_view.tile_ptr_from_indices(rm, rn, tile.block_m, tile.block_n)
    for s in tl.static_range(ctx.world_size):
        inside = (rn >= s * N_per_rank) & (rn < (s + 1) * N_per_rank)
        src_ptrs, src_mask = src_view.tile_ptr_from_indices(rm, rn + (ctx.rank - s) * N_per_rank, tile.block_m,
                                                            tile.block_n)
        mask = dst_mask & src_mask & inside[None, :]
        tl.store(dst_ptrs, rma.load(src_ptrs, ctx.rank, s, ctx.heap_bases, mask=mask), mask=mask)


@triton.jit
def _all_gather_push(tile, dst_view, dim: tl.constexpr, ctx):
    """``tile.data`` into this rank's block (an even split of dst_view's rows or columns) of every rank's
    ``dst_view``."""
    rm, rn = tile.indices()
    if dim == 0:
        rows = dst_view.M // ctx.world_size
        ptrs, mask = dst_view.offset_tile_ptr(tile, offset_m=ctx.rank * rows, src_mask=(rm < rows)[:, None])
    else:
        cols = dst_view.N // ctx.world_size
        ptrs, mask = dst_view.offset_tile_ptr(tile, offset_n=ctx.rank * cols, src_mask=(rn < cols)[None, :])
    for r in tl.static_range(ctx.world_size):
        rma.store(ptrs, tile.data.to(dst_view.ptr.dtype.element_ty), ctx.rank, r, ctx.heap_bases, mask=mask)


class _ContextCollectives:
    """The tile collectives as methods of the device context (``ctx`` filled in), added to ``iris.DeviceContext``
    by importing iris.x. Example: ``ctx.all_reduce(tile, src, dst, config=iris.x.AllReduceConfig("ring"))``."""

    @triton.jit
    def all_reduce(self, tile, src_view, dst_view, config=None, tile_id=None):
        """The all-reduce ``config`` (an :class:`~iris.x.core.AllReduceConfig`) names, with its locks; without one,
        :func:`all_reduce_atomic`. ``tile_id``: spinlock's lock. Example: ``ctx.all_reduce(tile, src, dst)``."""
        if config is None:
            all_reduce_atomic(tile, dst_view, self)
        else:
            locks = None
            if config.has_locks:
                locks = config.locks_ptr
            if config.variant_code == 1:
                all_reduce_ring(tile, src_view, dst_view, self)
            elif config.variant_code == 2:
                all_reduce_one_shot(tile, src_view, dst_view, locks, self)
            elif config.variant_code == 3:
                all_reduce_two_shot(tile, src_view, dst_view, locks, self)
            elif config.variant_code == 4:
                tl.static_assert(config.has_locks, "AllReduceConfig('spinlock', locks): the spinlock needs locks")
                all_reduce_spinlock(tile, dst_view, locks, self, tile_id)
            else:
                all_reduce_atomic(tile, dst_view, self)

    @triton.jit
    def all_reduce_atomic(self, tile, dst_view):
        """:func:`all_reduce_atomic`. Example: ``ctx.all_reduce_atomic(tile, dst_view)``."""
        all_reduce_atomic(tile, dst_view, self)

    @triton.jit
    def all_reduce_spinlock(self, tile, dst_view, locks):
        """:func:`all_reduce_spinlock`. Example: ``ctx.all_reduce_spinlock(tile, dst_view, locks)``."""
        all_reduce_spinlock(tile, dst_view, locks, self)

    @triton.jit
    def all_reduce_one_shot(self, tile, src_view, dst_view, locks, signal_value=1):
        """:func:`all_reduce_one_shot`, e.g. ``ctx.all_reduce_one_shot(tile, src, dst, locks)``."""
        all_reduce_one_shot(tile, src_view, dst_view, locks, self, signal_value)

    @triton.jit
    def all_reduce_ring(self, tile, src_view, dst_view):
        """:func:`all_reduce_ring`. Example: ``ctx.all_reduce_ring(tile, src_view, dst_view)``."""
        all_reduce_ring(tile, src_view, dst_view, self)

    @triton.jit
    def all_reduce_two_shot(self, tile, src_view, dst_view, locks, signal_value=1):
        """:func:`all_reduce_two_shot`, dealt round-robin, e.g. ``ctx.all_reduce_two_shot(tile, src, dst, locks)``."""
        all_reduce_two_shot(tile, src_view, dst_view, locks, self.rank, self.world_size, self, signal_value)

    @triton.jit
    def all_gather(self, tile, src_view, dst_view, dim=None):
        """:func:`all_gather`, e.g. ``ctx.all_gather(tile, src, dst, 0)``; as ``ctx.all_gather(tile, dst, dim)``, this
        rank's ``tile.data`` pushed into its block of every rank's ``dst`` (complete after a barrier)."""
        if dim is None:
            _all_gather_push(tile, src_view, dst_view, self)
        else:
            all_gather(tile, src_view, dst_view, dim, self)

    @triton.jit
    def gather(self, tile, src_view, source_rank):
        """:func:`gather`. Example: ``data = ctx.gather(tile, src_view, 0)``."""
        return gather(tile, src_view, source_rank, self)

    @triton.jit
    def all_to_all(self, tile, src_view, dst_view, N_per_rank):
        """:func:`all_to_all`. Example: ``ctx.all_to_all(tile, src_view, dst_view, N_per_rank)``."""
        all_to_all(tile, src_view, dst_view, N_per_rank, self)

    @triton.jit
    def reduce_scatter(self, tile, src_view, dst_view, locks=None, signal_value=1):
        """:func:`reduce_scatter`, e.g. ``ctx.reduce_scatter(tile, src, dst)`` (no ``locks``: no flags)."""
        reduce_scatter(tile, src_view, dst_view, locks, self, signal_value)


bind_methods(DeviceContext, _ContextCollectives)
