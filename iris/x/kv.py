"""KV-cache exchange between ranks, a tile at a time: context parallelism (every rank needs every rank's keys and
values) and disaggregated prefill -> decode (the tokens a rank computed go to the rank that serves them).

A KV cache is seen as a 2-D tensor per rank: tokens x (heads * head_dim), a row per token, head ``h`` in columns
``[h * head_dim, (h + 1) * head_dim)`` (a ``[tokens, heads, head_dim]`` cache with contiguous heads, or one layer
of a bigger one: any row stride). A tile is one block of tokens of one head, ``TileView(token_block, head, BLOCK_T,
BLOCK_D)``, ``BLOCK_D`` at least ``head_dim`` (columns past it are masked, so head_dim need not be a power of two).

=================  ==================================================================================================
view               what it holds (T: tokens per rank block; W: the world size)
=================  ==================================================================================================
``k_src, v_src``   this rank's keys and values to send, anywhere in memory: T rows (the same block goes to every rank:
                   context parallelism's exchange, ROCm/iris's ``send_kv``) or W*T rows (rows
                   ``[d*T, (d+1)*T)`` go to rank d: an all-to-all, e.g. prefill ranks re-sharding for decode)
``k_dst, v_dst``   on the heap, W*T rows alike on every rank: rows ``[s*T, (s+1)*T)`` receive rank s's block
``flags``          on the heap, int32, ``[W, cdiv(T, BLOCK_T), heads]``, zeroed once: on the receiver,
                   ``flags[s, b, h]`` reaches ``value`` when rank s's tile (b, h) is in place
=================  ==================================================================================================

:func:`send_kv` pushes this rank's tile to every rank (itself included), each destination's flag set with a
release at system scope right after its data; :func:`wait_kv` spins on one flag (acquire), and :func:`recv_kv`
waits and returns the received keys and values, so a consumer reads only what has arrived. Passing the call's
number as ``value`` (1, 2, ...) reuses the flags without resetting them; before a rank sends again into the same
``k_dst``, its peers must be done reading the previous call's blocks (a barrier). A program that waits on a flag
must not depend on a program of its launch that may not be running: send the tile before waiting for the same
tile of the peers (every rank does), or launch a persistent grid.

Example (inside a ``@triton.jit`` kernel, one program per (token block, kv head)):
    >>> tile = iris.x.TileView(pid_t, pid_h, BLOCK_T, BLOCK_D)
    >>> iris.x.send_kv(tile, k_src, v_src, k_dst, v_dst, flags, ctx, HEAD_DIM, call)
    >>> for s in range(world):
    ...     k, v = iris.x.recv_kv(tile, k_dst, v_dst, flags, s, ctx, HEAD_DIM, call)
"""

import triton
import triton.language as tl

from iris.device import atomics, rma
from iris.device.context import DeviceContext, bind_methods
from iris.x.collectives import wait_tile_ready


@triton.jit
def _head_block(view, first_row, tokens, tile, head_dim):
    """(pointers, mask) of ``tile``'s tokens and head in ``view``, its rank block starting at row ``first_row``:
    tokens past ``tokens`` (the block's size), columns past ``head_dim`` and anything outside the view masked."""
    t = tile.pid_m * tile.block_m + tl.arange(0, tile.block_m)
    d = tl.arange(0, tile.block_n)
    ptrs, mask = view.tile_ptr_from_indices(first_row + t, tile.pid_n * head_dim + d, tile.block_m, tile.block_n)
    return ptrs, mask & (t < tokens)[:, None] & (d < head_dim)[None, :]


@triton.jit
def _kv_flag(tile, k_dst, from_rank, ctx, head_dim):
    """The index in ``flags`` of rank ``from_rank``'s tile: ``[from_rank, tile.pid_m, tile.pid_n]`` of a
    ``[world, cdiv(T, block_m), heads]`` array."""
    tokens = k_dst.M // ctx.world_size
    heads = k_dst.N // head_dim
    return (tl.cdiv(tokens, tile.block_m) * from_rank + tile.pid_m) * heads + tile.pid_n


@triton.jit
def send_kv(tile, k_src, v_src, k_dst, v_dst, flags, ctx, head_dim=None, value=1):
    """Send this rank's KV tile (token block ``tile.pid_m``, head ``tile.pid_n``) to every rank: into rows
    ``[rank*T, (rank+1)*T)`` of rank d's ``k_dst`` and ``v_dst`` (T = ``k_dst.M // world``), read from ``k_src`` and
    ``v_src``'s T rows (the same block to every rank) or from their rows ``[d*T, (d+1)*T)`` (W*T rows: a block per
    destination); then set rank d's ``flags[rank, tile.pid_m, tile.pid_n]`` to ``value`` (release, system scope).
    ``head_dim``: columns per head (default ``tile.block_n``). ``v_src`` and ``v_dst`` None: keys only (one latent
    cache). Values are converted to ``k_dst``'s dtype.
    Example: ``iris.x.send_kv(tile, k_src, v_src, k_dst, v_dst, flags, ctx, HEAD_DIM)``."""
    if head_dim is None:
        head_dim = tile.block_n
    tokens = k_dst.M // ctx.world_size
    per_rank = k_src.M > tokens  # W*T rows: a block per destination
    flag = flags + _kv_flag(tile, k_dst, ctx.rank, ctx, head_dim)
    for i in tl.static_range(ctx.world_size):
        d = (ctx.rank + i) % ctx.world_size  # ranks start on different peers
        # the tensor first in each product: in the interpreter, constexpr * tensor stays a constexpr
        first = tl.where(per_rank, tokens * d, 0)
        src_ptrs, src_mask = _head_block(k_src, first, tokens, tile, head_dim)
        dst_ptrs, dst_mask = _head_block(k_dst, tokens * ctx.rank, tokens, tile, head_dim)
        mask = src_mask & dst_mask
        rma.store(dst_ptrs, tl.load(src_ptrs, mask=mask), ctx.rank, d, ctx.heap_bases, mask=mask)
        if v_src is not None:
            src_ptrs, src_mask = _head_block(v_src, first, tokens, tile, head_dim)
            dst_ptrs, dst_mask = _head_block(v_dst, tokens * ctx.rank, tokens, tile, head_dim)
            mask = src_mask & dst_mask
            rma.store(dst_ptrs, tl.load(src_ptrs, mask=mask), ctx.rank, d, ctx.heap_bases, mask=mask)
        tl.debug_barrier()  # every thread's stores before the flag
        atomics.atomic_xchg(flag, value, ctx.rank, d, ctx.heap_bases, sem="release", scope="sys")


@triton.jit
def wait_kv(tile, k_dst, flags, from_rank, ctx, head_dim=None, value=1):
    """Spin until rank ``from_rank``'s KV tile (token block ``tile.pid_m``, head ``tile.pid_n``) has arrived in this
    rank's ``k_dst`` (and ``v_dst``): its flag here at least ``value`` (acquire, system scope).
    Example: ``iris.x.wait_kv(tile, k_dst, flags, s, ctx, HEAD_DIM)``."""
    if head_dim is None:
        head_dim = tile.block_n
    wait_tile_ready(flags, _kv_flag(tile, k_dst, from_rank, ctx, head_dim), ctx.rank, ctx, value)


@triton.jit
def recv_kv(tile, k_dst, v_dst, flags, from_rank, ctx, head_dim=None, value=1):
    """Rank ``from_rank``'s KV tile, once arrived (:func:`wait_kv`), returned as (keys, values): ``tile.block_m`` x
    ``tile.block_n`` blocks from this rank's ``k_dst`` and ``v_dst``, zeros past the block's tokens and the head.
    Example: ``k, v = iris.x.recv_kv(tile, k_dst, v_dst, flags, s, ctx, HEAD_DIM)``."""
    if head_dim is None:
        head_dim = tile.block_n
    wait_kv(tile, k_dst, flags, from_rank, ctx, head_dim, value)
    tokens = k_dst.M // ctx.world_size
    k_ptrs, k_mask = _head_block(k_dst, tokens * from_rank, tokens, tile, head_dim)
    v_ptrs, v_mask = _head_block(v_dst, tokens * from_rank, tokens, tile, head_dim)
    return tl.load(k_ptrs, mask=k_mask, other=0), tl.load(v_ptrs, mask=v_mask, other=0)


class _ContextKV:
    """The KV exchange as methods of the device context (``ctx`` filled in), added to ``iris.DeviceContext`` by
    importing iris.x. Example: ``ctx.send_kv(tile, k_src, v_src, k_dst, v_dst, flags, HEAD_DIM)``."""

    @triton.jit
    def send_kv(self, tile, k_src, v_src, k_dst, v_dst, flags, head_dim=None, value=1):
        """:func:`send_kv`. Example: ``ctx.send_kv(tile, k_src, v_src, k_dst, v_dst, flags, HEAD_DIM)``."""
        send_kv(tile, k_src, v_src, k_dst, v_dst, flags, self, head_dim, value)

    @triton.jit
    def wait_kv(self, tile, k_dst, flags, from_rank, head_dim=None, value=1):
        """:func:`wait_kv`. Example: ``ctx.wait_kv(tile, k_dst, flags, s, HEAD_DIM)``."""
        wait_kv(tile, k_dst, flags, from_rank, self, head_dim, value)

    @triton.jit
    def recv_kv(self, tile, k_dst, v_dst, flags, from_rank, head_dim=None, value=1):
        """:func:`recv_kv`. Example: ``k, v = ctx.recv_kv(tile, k_dst, v_dst, flags, s, HEAD_DIM)``."""
        return recv_kv(tile, k_dst, v_dst, flags, from_rank, self, head_dim, value)


bind_methods(DeviceContext, _ContextKV)
