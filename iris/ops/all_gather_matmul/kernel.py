"""all_gather_matmul: ``output = [A_0 | A_1 | ... | A_{W-1}] @ B``, the all-gather of A inside the GEMM.

Every rank holds ``A_shard`` (M, K_r), its slice of A's columns, and B (W * K_r, N); A is never gathered in
full before the GEMM starts. A persistent kernel walks the output tiles; each program pushes pieces of
A_shard into every member's workspace slot ``LEAD`` tiles before they are needed, counting them on the
member's row-block flag. A tile multiplies the own slice in place, then waits for its row block and
multiplies the gathered slices.

Waits are on other programs, so launches are sized to run all programs at once; a wait at step s needs only
pushes of earlier steps, so it cannot deadlock. The last round's tiles may be split by member slice
(:func:`last_round`). Small A_shards go by copies instead (:func:`sends_by_copies`), and where it can, the
vendor's GEMM multiplies (:mod:`iris.ops.all_gather_matmul.vendor_gemm`).

Example:
    >>> A_shard = torch.randn(M, K // W, dtype=torch.bfloat16, device=ctx.get_device())
    >>> out = torch.empty(M, N, dtype=torch.bfloat16, device=ctx.get_device())
    >>> ctx.ops.all_gather_matmul(out, A_shard, B)           # B: (K, N)
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from iris.ccl.all_gather import store_to_members
from iris.device import sync, tracing
from iris.device.barrier import GROUP_ARGS, enter
from iris.host.replay import bind
from iris.ops import _fused
from iris.ops.all_gather_matmul import vendor_gemm
from iris.ops.config import FusedConfig
from iris.ops.gemm import (accumulate, accumulate_described, add_bias, hand_over, operand, take_over, tile_count,
                           tile_of)

LEAD = tl.constexpr(2)  # steps between a piece's push and the first tile that needs it
COPY_K = tl.constexpr(128)  # columns copied per load/store of a piece


@triton.jit
def _push_step(row_block, tiles_n, programs, GROUP_M: tl.constexpr):
    """The step (tile index of a program) at which a piece of ``row_block`` is pushed: LEAD before need."""
    first_need = (row_block // GROUP_M) * GROUP_M * tiles_n + row_block % GROUP_M  # see tile_of
    return tl.maximum(first_need // programs - LEAD, 0)


@triton.jit
def _push_due(step, a, gathered, flags, M, K_r, split, stride_am, stride_ak, tiles_m, tiles_n,
              members, count, index, cur, heap_bases, BLOCK_M: tl.constexpr, GROUP_M: tl.constexpr,
              FROM_STEP_ON: tl.constexpr):
    """Push this program's pieces due at ``step`` (``FROM_STEP_ON``: at ``step`` or later)."""
    programs = tl.num_programs(0)
    part = tl.cdiv(tl.cdiv(K_r, split), COPY_K) * COPY_K  # columns per piece
    slot = tl.cast(M, tl.int64) * K_r
    for piece in range(tl.program_id(0), tiles_m * split, programs):
        row_block = piece // split
        due = _push_step(row_block, tiles_n, programs, GROUP_M)
        if FROM_STEP_ON:
            go = due >= step
        else:
            go = due == step
        if go:
            rows = row_block * BLOCK_M + tl.arange(0, BLOCK_M)
            first = (piece % split) * part
            for k in range(first, tl.minimum(first + part, K_r), COPY_K):
                ks = k + tl.arange(0, COPY_K)
                mask = (rows[:, None] < M) & (ks[None, :] < K_r)
                x = tl.load(a + rows[:, None].to(tl.int64) * stride_am + ks[None, :] * stride_ak, mask=mask)
                place = index * slot + rows[:, None].to(tl.int64) * K_r + ks[None, :]
                # to every other member (across nodes: stored in this member's own slot, put from there per row)
                store_to_members(gathered + place, x, members, count, index, cur, heap_bases, mask, 1)
            tl.debug_barrier()  # every thread's stores of the piece before the flags
            for i in range(1, count):
                sync.signal(flags + row_block, 1, cur, tl.load(members + (index + i) % count), heap_bases, op="add")


@triton.jit
def _slice_product(acc, a, b, M, N, K_r, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n, a_row, b_row,
                   UPCAST: tl.constexpr, TMA: tl.constexpr, HOISTED: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``acc`` plus one member's slice ``a`` (M, K_r) times ``b`` (K_r, N) at output tile (tile_m, tile_n).

    ``HOISTED``: ``a`` and ``b`` are the program's descriptors, the slice at rows ``a_row`` and ``b_row``."""
    if HOISTED:
        acc = accumulate_described(acc, a, b, K_r, a_row + tile_m * BLOCK_M, tile_n * BLOCK_N, UPCAST, BLOCK_K, b_row)
    elif TMA:
        acc = accumulate_described(acc, operand(a, M, K_r, stride_am, TMA, BLOCK_M, BLOCK_K),
                                   operand(b, K_r, N, stride_bk, TMA, BLOCK_K, BLOCK_N), K_r, tile_m * BLOCK_M,
                                   tile_n * BLOCK_N, UPCAST, BLOCK_K, 0)
    else:
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = accumulate(acc, a, b, M, N, K_r, stride_am, stride_ak, stride_bk, stride_bn, rows, cols, UPCAST,
                         BLOCK_K)
    return acc


@triton.jit
def _descriptors(a, b, gathered, M, N, K_r, stride_am, stride_bk, count, HOISTED: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """(own, peers, b): with ``HOISTED``, descriptors made once per program instead of per slice and tile.

    Rows past M read the next slot, but feed only output rows that are never stored."""
    if HOISTED:
        own = tl.make_tensor_descriptor(a, shape=[M, K_r], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
        peers = tl.make_tensor_descriptor(gathered, shape=[count * M, K_r], strides=[K_r, 1],
                                          block_shape=[BLOCK_M, BLOCK_K])
        whole = tl.make_tensor_descriptor(b, shape=[count * K_r, N], strides=[stride_bk, 1],
                                          block_shape=[BLOCK_K, BLOCK_N])
    else:
        own, peers, whole = a, gathered, b
    return own, peers, whole


@triton.jit
def _tile_part(a, b, gathered, flags, want, M, N, K_r, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n,
               first, last, count, index, cur, trace, PUSHED: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
               HOISTED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Output tile (tile_m, tile_n)'s float32 product over member slices ``first`` to ``last - 1`` (0: own)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if first == 0:
        if HOISTED:
            acc = _slice_product(acc, a, b, M, N, K_r, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n, 0,
                                 index * K_r, UPCAST, TMA, HOISTED, BLOCK_M, BLOCK_N, BLOCK_K)
        else:
            acc = _slice_product(acc, a, b + index * K_r * stride_bk, M, N, K_r, stride_am, stride_ak, stride_bk,
                                 stride_bn, tile_m, tile_n, 0, 0, UPCAST, TMA, HOISTED, BLOCK_M, BLOCK_N, BLOCK_K)
    if last > 1:
        waiting = trace.start(tracing.WAIT, cur, cur, flags + tile_m, tile_m, tile_n, 0)
        if PUSHED:
            sync.wait_until(flags + tile_m, ">=", want)
        else:
            for i in range(tl.maximum(first, 1), last):
                sync.wait_until(flags + (index + i) % count, ">=", 1)
        tl.debug_barrier()  # the acquire before any thread reads the gathered slices
        if TMA:
            sync.async_proxy_fence()  # ... and before the descriptors read them
        trace.end(waiting)
    slot = tl.cast(M, tl.int64) * K_r
    for i in range(tl.maximum(first, 1), last):
        position = (index + i) % count
        if HOISTED:
            acc = _slice_product(acc, gathered, b, M, N, K_r, K_r, 1, stride_bk, stride_bn, tile_m, tile_n,
                                 position * M, position * K_r, UPCAST, TMA, HOISTED, BLOCK_M, BLOCK_N, BLOCK_K)
        else:
            acc = _slice_product(acc, gathered + position * slot, b + position * K_r * stride_bk, M, N, K_r, K_r, 1,
                                 stride_bk, stride_bn, tile_m, tile_n, 0, 0, UPCAST, TMA, HOISTED, BLOCK_M, BLOCK_N,
                                 BLOCK_K)
    return acc


@triton.jit
def _store_tile(acc, out, bias, M, N, stride_om, stride_on, tile_m, tile_n, HAS_BIAS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = add_bias(acc, bias, cols, N, HAS_BIAS)
    tl.store(out + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on,
             acc.to(out.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_gather_matmul_kernel(a, b, out, bias, gathered, flags, calls, parts, ready, M, N, K_r, split, whole,
                              stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on, members, count, index,
                              cur, heap_bases, arrivals, expected, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
                              WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr,
                              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                              GROUP_M: tl.constexpr, TMA: tl.constexpr = False, PUSHED: tl.constexpr = True,
                              PARTS: tl.constexpr = 1, HOISTED: tl.constexpr = False):
    # PUSHED: programs push pieces (flags per row block); else copies did (one flag per member position).
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    programs = tl.num_programs(0)
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, PUSHED, BARRIER_BLOCK, TRACE)
    want = (tl.load(calls) + 1) * (count - 1) * split  # every piece of a row block, from every other member
    own, peers, whole_b = _descriptors(a, b, gathered, M, N, K_r, stride_am, stride_bk, count, HOISTED, BLOCK_M,
                                       BLOCK_N, BLOCK_K)
    step = 0
    for tile in range(tl.program_id(0), whole, programs):
        if PUSHED:
            _push_due(step, a, gathered, flags, M, K_r, split, stride_am, stride_ak, tiles_m, tiles_n, members,
                      count, index, cur, heap_bases, BLOCK_M, GROUP_M, False)
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        span = trace.start(tracing.COMPUTE, cur, cur, out, tile_m, tile_n, 0)
        acc = _tile_part(own, whole_b, peers, flags, want, M, N, K_r, stride_am, stride_ak, stride_bk, stride_bn,
                         tile_m, tile_n, 0, count, count, index, cur, trace, PUSHED, UPCAST, TMA, HOISTED, BLOCK_M,
                         BLOCK_N, BLOCK_K)
        _store_tile(acc, out, bias, M, N, stride_om, stride_on, tile_m, tile_n, HAS_BIAS, BLOCK_M, BLOCK_N)
        trace.end(span)
        step += 1
    if PUSHED:  # every piece still owed, before any part waits on another program of this rank
        _push_due(step, a, gathered, flags, M, K_r, split, stride_am, stride_ak, tiles_m, tiles_n, members, count,
                  index, cur, heap_bases, BLOCK_M, GROUP_M, True)
    if PARTS > 1:
        # Every handed-over part precedes every finishing part in program order, so no wait waits on a waiter.
        rest = tiles_m * tiles_n - whole
        for unit in range((tl.program_id(0) - whole % programs + programs) % programs, rest * PARTS, programs):
            part = unit // rest
            tile_m, tile_n = tile_of(whole + unit % rest, tiles_m, tiles_n, GROUP_M)
            span = trace.start(tracing.COMPUTE, cur, cur, out, tile_m, tile_n, 0)
            acc = _tile_part(own, whole_b, peers, flags, want, M, N, K_r, stride_am, stride_ak, stride_bk,
                             stride_bn, tile_m, tile_n, part * count // PARTS, (part + 1) * count // PARTS, count,
                             index, cur, trace, PUSHED, UPCAST, TMA, HOISTED, BLOCK_M, BLOCK_N, BLOCK_K)
            if part < PARTS - 1:
                hand_over(acc, parts, ready, unit, BLOCK_M, BLOCK_N)
            else:
                acc = take_over(acc, parts, ready, unit % rest, rest, PARTS, BLOCK_M, BLOCK_N)
                _store_tile(acc, out, bias, M, N, stride_om, stride_on, tile_m, tile_n, HAS_BIAS, BLOCK_M, BLOCK_N)
            trace.end(span)


WHAT = "all_gather_matmul"


def _check(ctx, output, A_shard, B, bias, config) -> None:
    world = ctx.get_num_ranks()

    if not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in (A_shard, B)):
        raise ValueError(f"{WHAT}: A_shard and B must be 2-D tensors")
    if B.shape[0] != world * A_shard.shape[1]:
        raise ValueError(f"{WHAT}: B has {B.shape[0]} rows; it needs {world} x A_shard's {A_shard.shape[1]} "
                         f"columns = {world * A_shard.shape[1]}")
    # B's first K_r rows stand for B in the shape checks
    _fused.check(WHAT, ctx, output, A_shard, B[: A_shard.shape[1]], bias, lambda M, K, N: (M, N),
                 symmetric_output=False)
    obstacles = [config.vendor_gemm and _fused.vendor_dtype_refusal(output, A_shard)]
    # asked for explicitly: refused aloud
    obstacles += [getattr(config, option) and _copy_obstacle(ctx, A_shard, option)
                  for option in ("copy_engine", "vendor_gemm")]
    for obstacle in obstacles:
        if obstacle:
            raise ValueError(f"{WHAT}: {obstacle}")


COPY_ENGINE_AUTO_ROWS = 1024


def _copy_obstacle(ctx, A_shard, option: str = "copy_engine") -> str | None:
    """Why A_shard cannot go by copies in this call (asked for by FusedConfig's ``option``), or None."""
    if not A_shard.is_contiguous():
        return (f"FusedConfig({option}=True) sends A_shard in one copy per member, so it must be contiguous "
                f"(strides {tuple(A_shard.stride())}); pass A_shard.contiguous()")
    return _fused.copy_refusal(ctx)


def sends_by_copies(ctx, config, A_shard) -> bool:
    """Whether this call sends A_shard by copies (None: up to COPY_ENGINE_AUTO_ROWS rows, where it can)."""
    if config.copy_engine is not None:
        return config.copy_engine
    return A_shard.shape[0] <= COPY_ENGINE_AUTO_ROWS and _copy_obstacle(ctx, A_shard) is None


def takes_vendor_gemm(ctx, config, output, A_shard) -> bool:
    """Whether this call multiplies by the vendor's GEMM (None: 16-bit A, output of A's dtype, copies possible,
    and none of the kernel's own knobs set)."""
    if config.vendor_gemm is not None:
        return config.vendor_gemm
    return (config.copy_engine is None and config.tma_loads is None and config.split_k is None
            and A_shard.dtype in (torch.bfloat16, torch.float16) and output.dtype == A_shard.dtype
            and _copy_obstacle(ctx, A_shard) is None)


def last_round(tiles: int, programs: int, members: int, split_k: int | None) -> tuple[int, int]:
    """(whole, parts): the first ``whole`` tiles computed whole, the last round's in ``parts`` parts by member slice.

    Why: a short last round leaves programs idle. ``split_k`` where set, else the parts that finish soonest.

    Example:
        >>> last_round(448, 128, 2, None)   # 3 rounds whole, 64 tiles in two halves: 128 programs busy
        (384, 2)
    """
    choices = range(1, members + 1) if split_k is None else (min(split_k, members),)
    return _fused.split_last_round(tiles, programs, choices)


def problem(ctx, output, A_shard, config):
    """(key, spec, tile) of one call; by the vendor's GEMM, its workspace and no tile."""
    if takes_vendor_gemm(ctx, config, output, A_shard):
        return *vendor_gemm.problem(ctx, A_shard), None
    world = ctx.get_num_ranks()
    M, K_r = A_shard.shape
    N = output.shape[1]
    tile = _fused.tile(ctx, config, A_shard.dtype, M, N)
    tiles = tile_count(M, N, tile)
    split_k = 1 if config.split_k is None and M < _fused.SPLIT_MIN_ROWS else config.split_k  # as matmul_all_gather's
    whole, parts = last_round(tiles, _fused.concurrent_programs(ctx), world, split_k)
    copied = sends_by_copies(ctx, config, A_shard)
    key = (WHAT, M, K_r, N, A_shard.dtype, tuple(tile.values()), copied, whole, parts)
    tiles_m = triton.cdiv(M, tile["BLOCK_M"])
    handed = (parts - 1) * (tiles - whole)  # parts handed over to the part that finishes their tile
    spec = {"gathered": _fused.Buffer(world * M * K_r, A_shard.dtype, heap=True),
            "flags": _fused.Buffer(world if copied else tiles_m, torch.int64, heap=True, zeroed=True),
            "calls": _fused.Buffer(1, torch.int64, heap=False, zeroed=True),
            "parts": _fused.Buffer(handed * tile["BLOCK_M"] * tile["BLOCK_N"], torch.float32, heap=False),
            "ready": _fused.Buffer(handed, torch.int32, heap=False, zeroed=True)}
    return key, spec, dict(tile, PARTS=parts, whole=whole)


def _tma_loads(ctx, config, A_shard, B) -> bool:
    """Descriptor loads, where the gathered slices' rows and bases are 16-byte aligned too."""
    M, K_r = A_shard.shape
    size = A_shard.element_size()
    return (K_r * size) % 16 == 0 and (M * K_r * size) % 16 == 0 and _fused.tma_loads(ctx, config, A_shard, B)


def preamble(ctx, output, A_shard, B, config=None) -> _fused.Workspace:
    """Check the operands and make the workspace; collective (a heap allocation)."""
    config = FusedConfig() if config is None else config
    _check(ctx, output, A_shard, B, None, config)
    key, spec, _ = problem(ctx, output, A_shard, config)
    return _fused.Workspace.allocate(ctx, key, spec)


def all_gather_matmul(ctx, output, A_shard, B, bias=None, async_op=False, config=None,
                      workspace=None) -> tuple:
    """``output = all_gather(A_shard, dim=1) @ B (+ bias)``; every rank calls it.

    Returns the workspace and its bound launches, not yet launched (``ctx.ops`` launches and replays them).

    Args:
        output: (M, N), float32, bfloat16 or float16, on this rank's device (need not be on the heap).
        A_shard: (M, K_r) this rank's columns of A, bfloat16 or float16; B: (W * K_r, N), the same dtype.
        bias: optional (N,). async_op: accepted; the output is complete when the kernel ends.
        config: an :class:`iris.ops.FusedConfig`. workspace: from ``ctx.ops.all_gather_matmul_preamble``.
    """
    config = FusedConfig() if config is None else config
    _check(ctx, output, A_shard, B, bias, config)
    key, spec, tile = problem(ctx, output, A_shard, config)
    workspace = _fused.workspace_for(ctx, WHAT, key, spec, workspace)
    if tile is None:  # by the vendor's GEMM
        return workspace, vendor_gemm.launches(ctx, output, A_shard, B, bias, workspace)
    copied = sends_by_copies(ctx, config, A_shard)
    M, K_r = A_shard.shape
    N = output.shape[1]
    whole = tile.pop("whole")
    programs = _fused.launch_size(ctx, whole + (tile_count(M, N, tile) - whole) * tile["PARTS"])
    split = max(1, programs // triton.cdiv(M, tile["BLOCK_M"]))  # pieces per row block: every program pushes
    tma = _tma_loads(ctx, config, A_shard, B)
    kernel = bind(
        _all_gather_matmul_kernel, (programs,),
        A_shard, B, output, bias if bias is not None else output, workspace.gathered, workspace.flags,
        workspace.calls, workspace.parts, workspace.ready, M, N, K_r, split, whole, A_shard.stride(0),
        A_shard.stride(1), B.stride(0), B.stride(1), output.stride(0), output.stride(1),
        *_fused.barrier_arguments(ctx), HAS_BIAS=bias is not None, UPCAST=ctx.team.backend.upcasts_narrow_floats,
        WORLD=ctx.get_num_ranks(), BARRIER_BLOCK=ctx.team.barrier.block, TRACE=ctx.tracing.enabled,
        TMA=tma, PUSHED=not copied, HOISTED=tma and K_r % tile["BLOCK_K"] == 0, **tile)
    if copied:
        send, finish = _fused.sent_by_copies(ctx, A_shard, workspace.gathered, workspace.flags)
        launches = [ctx.team.barrier.launch(None), send, kernel, finish]
    else:  # the call counter, bumped on the stream: the flags count up across calls
        launches = [kernel, functools.partial(workspace.calls.add_, 1)]
    return workspace, launches
