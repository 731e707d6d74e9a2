"""Prefill attention (many queries per sequence, causal) over a KV cache, on one rank or read across ranks, with
ROCm/iris's names: the online-softmax step a user's kernel calls per key tile (:func:`flash_prefill_step`), the
tile loader of a paged cache spread over ranks (:func:`load_kv_tile_global_paged`), and host calls over a
contiguous cache (:func:`reference_prefill_attn`), a paged one (:func:`paged_prefill_attn`) and a paged one whose
pages live on several ranks, read through the heap (:func:`distributed_prefill_attn`: context parallelism's
prefill without gathering the cache first).

Layouts (D, the head dimension, a power of two from 16 up; heads grouped: H query heads over H_kv key heads,
query head h reads key head h // (H / H_kv)):

==========================  ===========================================================================================
tensor                      shape and meaning
==========================  ===========================================================================================
``q``, the output           (S, H, D), or (B, S, H, D) for B sequences; query i of sequence b sits at position
                            ``q_start[b] + i`` and sees the keys at positions up to its own (causal)
``k``, ``v`` (contiguous)   (S_kv, H_kv, D): keys and values of positions 0 .. S_kv - 1 of one sequence
``k_cache``, ``v_cache``    (pages, PAGE_SIZE, H_kv, D): a paged cache (vLLM's layout); PAGE_SIZE a power of two
``block_table``             (B, max_pages) int32: the page of sequence b's positions from ``j * PAGE_SIZE``
``global_block_table``      (B, max_pages, 2) int32: (rank that holds the page, the page there), the same on every
                            rank; the caches on the symmetric heap, allocated alike on every rank
``seq_lens``, ``kv_lens``   (B,) int32 on the device: keys of each sequence
==========================  ===========================================================================================

The single-rank calls take a sequence's queries as its last S positions (``q_start = seq_lens - S``: a whole prompt
where ``seq_lens == S``, a chunk of prefill after a cached prefix otherwise). :func:`distributed_prefill_attn`
takes each rank's first query position (rank r of a sequence split in equal chunks: ``r * chunk``) and reads
pages wherever the table says they are; it synchronizes nothing: every rank's pages must be written before any
rank reads them (``ctx.barrier()`` after the cache writes), and not rewritten while a peer still reads.

Example:
    >>> out = iris.x.prefill_attn.paged_prefill_attn(q, k_cache, v_cache, block_table, seq_lens)
    >>> mine = iris.x.prefill_attn.distributed_prefill_attn(q_chunk, k_cache, v_cache, table, kv_lens,
    ...                                                     ctx.get_rank() * chunk, ctx)
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from iris.device import rma
from iris.ops.gemm import dot
from iris.runtime import get_backend

# how the kernel finds a key tile (its MODE)
CONTIGUOUS, PAGED, GLOBAL_PAGED = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def flash_prefill_step(q_tile, k_tile, v_tile, acc, e_max, e_sum, q_offset, kv_offset, scale, causal: tl.constexpr,
                       BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, HEAD_DIM: tl.constexpr, kv_end=None,
                       UPCAST: tl.constexpr = False):
    """One key tile of the online softmax: ``(acc, e_max, e_sum)`` after the BLOCK_K keys at positions
    ``kv_offset ..`` (``k_tile``, ``v_tile``: BLOCK_K x HEAD_DIM) for the BLOCK_Q queries at ``q_offset ..``.

    ``acc`` (BLOCK_Q x HEAD_DIM, float32) is the unnormalized output, ``e_max`` each query's largest score so far
    (natural-log units, -inf before any key) and ``e_sum`` its sum of ``exp(score - e_max)``; the output is
    ``acc / e_sum`` once every tile is in. ``causal``: a key after its query is left out; ``kv_end``: keys at or
    past it are left out (a tile past a sequence's end). A query that has seen no key keeps ``e_sum`` 0.
    ``UPCAST``: the products in float32 (the CPU backend's interpreter).
    """
    scores = dot(q_tile, tl.trans(k_tile), tl.zeros((BLOCK_Q, BLOCK_K), tl.float32), UPCAST) * scale
    keys = kv_offset + tl.arange(0, BLOCK_K)
    keep = tl.full((BLOCK_Q, BLOCK_K), 1, tl.int1)
    if causal:
        keep = keep & ((q_offset + tl.arange(0, BLOCK_Q))[:, None] >= keys[None, :])
    if kv_end is not None:
        keep = keep & (keys < kv_end)[None, :]
    scores = tl.where(keep, scores, float("-inf"))
    new_max = tl.maximum(e_max, tl.max(scores, axis=1))
    anchor = tl.where(new_max == float("-inf"), 0.0, new_max)  # a query with no key yet: no nan from -inf - -inf
    rescale = tl.exp(e_max - anchor)
    weights = tl.exp(scores - anchor[:, None])
    acc = dot(weights.to(v_tile.dtype), v_tile, acc * rescale[:, None], UPCAST)
    return acc, new_max, e_sum * rescale + tl.sum(weights, axis=1)


@triton.jit
def load_kv_tile_global_paged(k_cache_ptr, v_cache_ptr, global_block_table_ptr, heap_bases, my_rank, world_size,
                              bid, kv_start, kv_h, stride_cb, stride_cs, stride_ch, stride_cd, stride_gbt_b,
                              stride_gbt_blk, PAGE_SIZE: tl.constexpr, BLOCK_K: tl.constexpr,
                              HEAD_DIM: tl.constexpr):
    """(K tile, V tile), BLOCK_K x HEAD_DIM, of key head ``kv_h`` at positions ``kv_start ..`` of sequence ``bid``,
    read from the rank the global block table names for their page (this rank's cache directly, a peer's
    through the heap). ``kv_start`` a multiple of BLOCK_K, and BLOCK_K divides PAGE_SIZE: a tile lies in one page.
    ``world_size`` is ROCm/iris's argument, unused: the owner is translated at run time."""
    entry = global_block_table_ptr + bid.to(tl.int64) * stride_gbt_b + (kv_start // PAGE_SIZE) * stride_gbt_blk
    owner = tl.load(entry)
    page = tl.load(entry + 1).to(tl.int64)
    offsets = _page_offsets(page, kv_start, kv_h, stride_cb, stride_cs, stride_ch, stride_cd, PAGE_SIZE, BLOCK_K,
                            HEAD_DIM)
    k_tile = rma.load(k_cache_ptr + offsets, my_rank, owner, heap_bases)
    v_tile = rma.load(v_cache_ptr + offsets, my_rank, owner, heap_bases)
    return k_tile, v_tile


@triton.jit
def _page_offsets(page, kv_start, kv_h, stride_cb, stride_cs, stride_ch, stride_cd, PAGE_SIZE: tl.constexpr,
                  BLOCK_K: tl.constexpr, HEAD_DIM: tl.constexpr):
    slots = kv_start % PAGE_SIZE + tl.arange(0, BLOCK_K)
    return (page * stride_cb + slots[:, None].to(tl.int64) * stride_cs + kv_h * stride_ch
            + tl.arange(0, HEAD_DIM)[None, :] * stride_cd)


@triton.jit
def _prefill_kernel(q, k, v, table, kv_lens, q_starts, out, heap_bases, S, q_blocks, scale, stride_qb, stride_qs,
                    stride_qh, stride_ob, stride_os, stride_oh, stride_kb, stride_ks, stride_kh, stride_kd,
                    stride_tb, stride_tp, my_rank, MODE: tl.constexpr, H_PER_KV: tl.constexpr,
                    PAGE_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr,
                    HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr):
    """One program per (sequence, query block) x query head; keys tile by tile up to its last query's position.
    MODE: CONTIGUOUS (``k``, ``v`` one sequence's (S_kv, H_kv, D)), PAGED (``table`` a block table) or
    GLOBAL_PAGED (``table`` a global block table, pages on any rank)."""
    bid = tl.program_id(0) // q_blocks
    first = (tl.program_id(0) % q_blocks) * BLOCK_Q
    head = tl.program_id(1)
    kv_h = head // H_PER_KV
    rows = first + tl.arange(0, BLOCK_Q)
    d = tl.arange(0, HEAD_DIM)
    inside = (rows < S)[:, None]
    q_base = q + bid.to(tl.int64) * stride_qb + head * stride_qh
    q_tile = tl.load(q_base + rows[:, None].to(tl.int64) * stride_qs + d[None, :], mask=inside, other=0.0)
    kv_len = tl.load(kv_lens + bid)
    q_start = tl.load(q_starts + bid)
    acc = tl.zeros((BLOCK_Q, HEAD_DIM), tl.float32)
    e_max = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
    e_sum = tl.zeros((BLOCK_Q,), tl.float32)
    end = tl.minimum(kv_len, q_start + tl.minimum(first + BLOCK_Q, S))  # past the block's last query: nothing
    for kv_start in range(0, end, BLOCK_K):
        if MODE == GLOBAL_PAGED:
            k_tile, v_tile = load_kv_tile_global_paged(k, v, table, heap_bases, my_rank, 0, bid, kv_start, kv_h,
                                                       stride_kb, stride_ks, stride_kh, stride_kd, stride_tb,
                                                       stride_tp, PAGE_SIZE, BLOCK_K, HEAD_DIM)
        else:
            if MODE == PAGED:
                page = tl.load(table + bid.to(tl.int64) * stride_tb + (kv_start // PAGE_SIZE) * stride_tp)
                offsets = _page_offsets(page.to(tl.int64), kv_start, kv_h, stride_kb, stride_ks, stride_kh,
                                        stride_kd, PAGE_SIZE, BLOCK_K, HEAD_DIM)
                present = tl.full((BLOCK_K, HEAD_DIM), 1, tl.int1)  # a page is whole
            else:
                keys = kv_start + tl.arange(0, BLOCK_K)
                offsets = keys[:, None].to(tl.int64) * stride_ks + kv_h * stride_kh + d[None, :] * stride_kd
                present = (keys < kv_len)[:, None]
            k_tile = tl.load(k + offsets, mask=present, other=0.0)
            v_tile = tl.load(v + offsets, mask=present, other=0.0)
        acc, e_max, e_sum = flash_prefill_step(q_tile, k_tile, v_tile, acc, e_max, e_sum, q_start + first,
                                               kv_start, scale, True, BLOCK_Q, BLOCK_K, HEAD_DIM, kv_len, UPCAST)
    result = acc / tl.where(e_sum == 0.0, 1.0, e_sum)[:, None]
    o_base = out + bid.to(tl.int64) * stride_ob + head * stride_oh
    tl.store(o_base + rows[:, None].to(tl.int64) * stride_os + d[None, :], result.to(out.dtype.element_ty),
             mask=inside)


def _batched(what: str, q: torch.Tensor) -> torch.Tensor:
    """``q`` as (B, S, H, D), checked: a 3-D q is one sequence."""
    if not isinstance(q, torch.Tensor) or q.dim() not in (3, 4):
        raise ValueError(f"{what}: q must be (S, H, D) or (B, S, H, D), got {getattr(q, 'shape', type(q).__name__)}")
    if q.dtype not in DTYPES:
        raise TypeError(f"{what}: q has dtype {q.dtype}; supported: float16, bfloat16, float32")
    d = q.shape[-1]
    if d < 16 or d & (d - 1):
        raise ValueError(f"{what}: the head dimension must be a power of two from 16 up, got {d}")
    q = q if q.dim() == 4 else q.unsqueeze(0)
    if q.stride(-1) != 1:
        raise ValueError(f"{what}: q's last dimension must be contiguous")
    return q


def _check_kv(what: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, paged: bool) -> None:
    want = 4 if paged else 3
    if not (isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor)) or k.dim() != want or k.shape != v.shape:
        layout = "(pages, PAGE_SIZE, H_kv, D)" if paged else "(S_kv, H_kv, D)"
        raise ValueError(f"{what}: k and v must both be {layout}; got {getattr(k, 'shape', k)} and "
                         f"{getattr(v, 'shape', v)}")
    if k.dtype != q.dtype or v.dtype != q.dtype or k.device != q.device or v.device != q.device:
        raise TypeError(f"{what}: q, k and v must share dtype and device")
    heads, kv_heads, d = q.shape[2], k.shape[-2], q.shape[-1]
    if k.shape[-1] != d or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"{what}: k's heads ({kv_heads}) must divide q's ({heads}) and their head dimensions "
                         f"match ({k.shape[-1]} vs {d})")
    if k.stride() != v.stride() or k.stride(-1) != 1:
        raise ValueError(f"{what}: k and v must have the same strides, the last dimension contiguous")
    if paged:
        page = k.shape[1]
        if page < 16 or page & (page - 1):
            raise ValueError(f"{what}: PAGE_SIZE (k_cache.shape[1]) must be a power of two from 16 up, got {page}")


def _per_sequence(what: str, name: str, value, batch: int, device) -> torch.Tensor:
    """``value`` (an int for every sequence, a list, or a device tensor of B) as int32 on ``device``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return torch.full((batch,), value, dtype=torch.int32, device=device)
    tensor = torch.as_tensor(value, device=device)
    if tensor.dim() != 1 or tensor.shape[0] != batch or tensor.dtype.is_floating_point:
        raise ValueError(f"{what}: {name} must be an int or {batch} integers (one per sequence), got "
                         f"{getattr(value, 'shape', value)}")
    return tensor.to(torch.int32)


def _launch(mode: int, q, k, v, table, kv_lens, q_starts, out, heap_bases=None, my_rank: int = 0, scale=None):
    batch, seq, heads, dim = q.shape
    backend = get_backend()
    compiled = backend.compiles_kernels
    paged = mode != CONTIGUOUS
    block_q = 64 if compiled else 16  # the interpreter: tl.dot's smallest tile
    page = k.shape[1] if paged else block_q  # contiguous keys: no pages (any multiple of the key tile)
    block_k = min(page, block_q)
    q_blocks = triton.cdiv(seq, block_q)
    if out is None:
        out = torch.empty_like(q)
    if not batch or not seq:
        return out
    kv_strides = k.stride() if paged else (0,) + k.stride()  # (page, slot, head, dim) or (0, position, head, dim)
    table_strides = (table.stride(0), table.stride(1)) if table is not None else (0, 0)
    _prefill_kernel[(batch * q_blocks, heads)](
        q, k, v, table if table is not None else kv_lens, kv_lens, q_starts, out,
        heap_bases if heap_bases is not None else kv_lens, seq, q_blocks,
        1.0 / math.sqrt(dim) if scale is None else float(scale), q.stride(0), q.stride(1), q.stride(2),
        out.stride(0), out.stride(1), out.stride(2), *kv_strides, *table_strides, my_rank, MODE=mode,
        H_PER_KV=heads // k.shape[-2], PAGE_SIZE=page, BLOCK_Q=block_q, BLOCK_K=block_k, HEAD_DIM=dim,
        UPCAST=backend.upcasts_narrow_floats, num_warps=4 if compiled else 1)
    return out


def _output(what: str, out, q: torch.Tensor) -> torch.Tensor | None:
    """``out`` as (B, S, H, D) (None: made by the launch), checked against ``q``."""
    if out is None:
        return None
    if not isinstance(out, torch.Tensor) or out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"{what}: out must be {tuple(q.shape)} {q.dtype} on {q.device}")
    out = out if out.dim() == 4 else out.unsqueeze(0)
    if out.stride(-1) != 1:
        raise ValueError(f"{what}: out's last dimension must be contiguous")
    return out


def reference_prefill_attn(q, k, v, scale=None, causal=True, out=None):
    """Causal prefill attention of one sequence on one device: ``q`` (S, H, D) over ``k``, ``v`` (S_kv, H_kv, D),
    the queries the last S positions; returns (S, H, D) in q's dtype. ``scale`` defaults to 1/sqrt(D).

    Example:
        >>> out = reference_prefill_attn(q, k, v)   # torch's sdpa(..., is_causal=True) where S == S_kv
    """
    what = "reference_prefill_attn"
    if not causal:
        raise ValueError(f"{what}: only causal attention is provided (causal=True)")
    batched = _batched(what, q)
    if batched.shape[0] != 1:
        raise ValueError(f"{what}: q must be one sequence, (S, H, D)")
    _check_kv(what, batched, k, v, paged=False)
    kv_lens = torch.full((1,), k.shape[0], dtype=torch.int32, device=q.device)
    result = _launch(CONTIGUOUS, batched, k, v, None, kv_lens, kv_lens - q.shape[-3],
                     _output(what, out, q), scale=scale)
    return result.view(q.shape)


def paged_prefill_attn(q, k_cache, v_cache, block_table, seq_lens, scale=None, out=None):
    """Causal prefill attention over a paged KV cache on one device: each sequence's queries are its last S
    positions, its keys the first ``seq_lens[b]`` positions of the pages ``block_table[b]`` lists (see the module's
    table); returns the output shaped as ``q``.

    Example:
        >>> out = paged_prefill_attn(q, k_cache, v_cache, block_table, seq_lens)   # q (B, S, H, D)
    """
    what = "paged_prefill_attn"
    batched = _batched(what, q)
    _check_kv(what, batched, k_cache, v_cache, paged=True)
    _check_table(what, block_table, batched.shape[0], 2, q.device)
    kv_lens = _per_sequence(what, "seq_lens", seq_lens, batched.shape[0], q.device)
    result = _launch(PAGED, batched, k_cache, v_cache, block_table, kv_lens, kv_lens - batched.shape[1],
                     _output(what, out, q), scale=scale)
    return result.view(q.shape)


def distributed_prefill_attn(q, k_cache, v_cache, global_block_table, kv_lens, q_start, ctx, scale=None,
                             out=None):
    """Causal prefill attention of this rank's queries over a paged KV cache whose pages live on any rank: the
    page of each key tile is read from the rank ``global_block_table`` names, through the heap (one launch, no
    gather of the cache). ``q_start``: the position of this rank's first query of each sequence (an int or B
    ints); ``kv_lens``: keys of each sequence. ``k_cache`` and ``v_cache`` on the heap, allocated alike on every
    rank and written before the call on every rank (see the module's docstring).

    Example:
        >>> chunk = q_chunk.shape[1]
        >>> ctx.barrier()                                      # every rank's pages written
        >>> out = distributed_prefill_attn(q_chunk, k_cache, v_cache, table, kv_lens, ctx.get_rank() * chunk, ctx)
    """
    what = "distributed_prefill_attn"
    batched = _batched(what, q)
    _check_kv(what, batched, k_cache, v_cache, paged=True)
    for name, tensor in (("k_cache", k_cache), ("v_cache", v_cache)):
        ctx.team.check_tensor(what, name, tensor, DTYPES, symmetric=True)
    _check_table(what, global_block_table, batched.shape[0], 3, q.device)
    lens = _per_sequence(what, "kv_lens", kv_lens, batched.shape[0], q.device)
    starts = _per_sequence(what, "q_start", q_start, batched.shape[0], q.device)
    result = _launch(GLOBAL_PAGED, batched, k_cache, v_cache, global_block_table, lens, starts,
                     _output(what, out, q), heap_bases=ctx.get_heap_bases(), my_rank=ctx.get_rank(),
                     scale=scale)
    return result.view(q.shape)


def _check_table(what: str, table, batch: int, dims: int, device) -> None:
    name = "block_table" if dims == 2 else "global_block_table"
    layout = "(B, max_pages)" if dims == 2 else "(B, max_pages, 2)"
    if (not isinstance(table, torch.Tensor) or table.dim() != dims or table.shape[0] != batch
            or (dims == 3 and (table.shape[2] != 2 or table.stride(2) != 1)) or table.dtype != torch.int32
            or table.device != device):
        raise ValueError(f"{what}: {name} must be {layout} int32 on {device} with B = {batch}, got "
                         f"{getattr(table, 'shape', table)} {getattr(table, 'dtype', '')}")
