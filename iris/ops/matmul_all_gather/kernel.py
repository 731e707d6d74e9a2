"""GEMM whose output tiles go straight to every rank: ``matmul_all_gather`` and ``gemm_all_scatter``.

Every rank computes ``A_r @ B_r`` (+ ``bias``) and every rank receives all products side by side in its
heap ``output``: rows at ``r * M`` (``matmul_all_gather``) or columns at ``r * N`` (``gemm_all_scatter``).
Each program stores its tile into every member's output straight from registers, so a tile's transfer
overlaps the next tile's GEMM; barriers per program before the first store and after the last (unless
``async_op``: then call ``ctx.device_barrier()`` before reading). With a K split, S programs share a tile:
every part but the last is handed over through a local workspace, and the last part finishes the tile.

Example:
    >>> W = ctx.get_num_ranks()
    >>> out = ctx.empty(W * M, N, dtype=torch.bfloat16)        # on the heap: peers write into it
    >>> ctx.ops.matmul_all_gather(out, A, B)
    >>> scattered = ctx.empty(M, W * N_shard, dtype=torch.bfloat16)
    >>> ctx.ops.gemm_all_scatter(scattered, A, B_shard)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.ccl.all_gather import store_to_members
from iris.device import tracing, triggered
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes
from iris.host.replay import bind
from iris.host.triggered import TriggeredPlan
from iris.ops import _fused
from iris.ops.config import FusedConfig
from iris.ops.gemm import add_bias, hand_over, operand, store_tile, take_over, tile_count, tile_of, tile_product


@triton.jit(do_not_specialize=GROUP_ARGS)
def _matmul_gather_kernel(a, b, out, bias, parts, ready, gates, M, N, K, whole, stride_am, stride_ak, stride_bk,
                          stride_bn, stride_om, stride_on, members, count, index, cur, heap_bases, arrivals, expected,
                          ALONG_M: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, WORLD: tl.constexpr,
                          EXIT_BARRIER: tl.constexpr, BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr,
                          TMA: tl.constexpr, TRIGGERED: tl.constexpr, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    programs = tl.num_programs(0)
    a_tiles = operand(a, M, K, stride_am, TMA, BLOCK_M, BLOCK_K)
    b_tiles = operand(b, K, N, stride_bk, TMA, BLOCK_K, BLOCK_N)
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, True, BARRIER_BLOCK, TRACE)
    for tile in range(tl.program_id(0), whole, programs):  # the tiles computed whole
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        span = trace.start(tracing.COMPUTE, cur, cur, out, tile_m, tile_n, 0)
        acc, rows, cols = tile_product(a_tiles, b_tiles, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                       tile_m, tile_n, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
        trace.end(span)
        if TRIGGERED:  # into this rank's place only; the row block's copies go once its every tile is here
            store_tile(acc, out + tl.cast(index * M, tl.int64) * stride_om, bias, rows, cols, M, N, stride_om,
                       stride_on, HAS_BIAS)
            triggered.publish(gates, index * tiles_m + tile_m)
        else:
            _finish_tile(acc, rows, cols, out, bias, M, N, stride_om, stride_on, tile_m, tile_n, members, count,
                         index, cur, heap_bases, trace, ALONG_M, HAS_BIAS, BLOCK_M, BLOCK_N)
    if SPLIT > 1:  # the rest in K parts (see the module), units whole + part * rest + t dealt on as the tiles were
        rest = tiles_m * tiles_n - whole
        depth = tl.cdiv(tl.cdiv(K, SPLIT), BLOCK_K) * BLOCK_K  # K of a part: whole steps (the last part: the rest)
        for unit in range((tl.program_id(0) - whole % programs + programs) % programs, rest * SPLIT, programs):
            part = unit // rest
            tile_m, tile_n = tile_of(whole + unit % rest, tiles_m, tiles_n, GROUP_M)
            span = trace.start(tracing.COMPUTE, cur, cur, out, tile_m, tile_n, 0)
            start = tl.cast(part * depth, tl.int64)
            acc, rows, cols = tile_product(a + start * stride_ak, b + start * stride_bk, M, N,
                                           tl.maximum(tl.minimum(depth, K - part * depth), 0), stride_am, stride_ak,
                                           stride_bk, stride_bn, tile_m, tile_n, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)
            trace.end(span)
            if part < SPLIT - 1:
                hand_over(acc, parts, ready, unit, BLOCK_M, BLOCK_N)
            else:
                _finish_tile(take_over(acc, parts, ready, unit % rest, rest, SPLIT, BLOCK_M, BLOCK_N), rows, cols,
                             out, bias, M, N, stride_om, stride_on, tile_m, tile_n, members, count, index, cur,
                             heap_bases, trace, ALONG_M, HAS_BIAS, BLOCK_M, BLOCK_N)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


@triton.jit
def _finish_tile(acc, rows, cols, out, bias, M, N, stride_om, stride_on, tile_m, tile_n, members, count, index, cur,
                 heap_bases, trace, ALONG_M: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """A whole tile's product: the bias, then into every member's output at this rank's place."""
    acc = add_bias(acc, bias, cols, N, HAS_BIAS)
    value = acc.to(out.dtype.element_ty)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    if ALONG_M:
        place = (rows[:, None] + index * M).to(tl.int64) * stride_om + cols[None, :] * stride_on
    else:
        place = rows[:, None].to(tl.int64) * stride_om + (cols[None, :] + index * N) * stride_on
    span = trace.start(tracing.PUT, cur, -1, out, tile_m, tile_n, elements_bytes(out, count * BLOCK_M * BLOCK_N))
    # into every member, each rank starting at a different one
    store_to_members(out + place, value, members, count, index, cur, heap_bases, mask, 0)
    trace.end(span)


def _output_shape(along_m: bool, world: int):
    return lambda M, K, N: (world * M, N) if along_m else (M, world * N)


def problem(what: str, along_m: bool, ctx, A, B, config: FusedConfig) -> tuple:
    """(key, spec, tile) of one call: the tile with its K split and ``whole`` (tiles computed unsplit first), and
    the workspace a split needs.

    Without ``config.split_k``, few tiles split every tile; else only the last round's tiles may split."""
    M, N = A.shape[0], B.shape[1]
    copies = config.copy_engine is True  # row blocks by copies: every tile computed whole
    tile = _fused.tile(ctx, config, A.dtype, M, N, (1,) if copies else _fused.SPLITS)
    tiles = tile_count(M, N, tile)
    whole = 0 if tile["SPLIT"] > 1 else tiles
    if tile["SPLIT"] == 1 and config.split_k is None and M >= _fused.SPLIT_MIN_ROWS and not copies:
        whole, tile["SPLIT"] = _fused.split_last_round(tiles, _fused.concurrent_programs(ctx), _fused.SPLITS)
    handed = (tile["SPLIT"] - 1) * (tiles - whole)  # parts handed over
    spec = {} if handed == 0 else {
        "parts": _fused.Buffer(handed * tile["BLOCK_M"] * tile["BLOCK_N"], torch.float32, heap=False),
        "ready": _fused.Buffer(handed, torch.int32, heap=False, zeroed=True)}
    key = (what,) if handed == 0 else (what, M, N, tile["BLOCK_M"], tile["BLOCK_N"], tile["SPLIT"], whole)
    return key, spec, dict(tile, whole=whole)


def preamble(what: str, along_m: bool, ctx, output, A, B, config=None) -> _fused.Workspace:
    """Check the operands and make the workspace (empty unless the call splits K)."""
    config = FusedConfig() if config is None else config
    _fused.check(what, ctx, output, A, B, None, _output_shape(along_m, ctx.get_num_ranks()), symmetric_output=True)
    key, spec, _ = problem(what, along_m, ctx, A, B, config)
    return _fused.Workspace.allocate(ctx, key, spec)


def run(what: str, along_m: bool, ctx, output, A, B, bias=None, async_op=False, config=None,
        workspace=None) -> tuple:
    """One checked call of ``what``: the workspace and its bound launch, not yet launched."""
    config = FusedConfig() if config is None else config
    _fused.check(what, ctx, output, A, B, bias, _output_shape(along_m, ctx.get_num_ranks()), symmetric_output=True)
    copies = config.copy_engine is True
    if copies:
        _refuse_copies(what, along_m, config, output)
    key, spec, tile = problem(what, along_m, ctx, A, B, config)
    workspace = _fused.workspace_for(ctx, what, key, spec, workspace)
    M, N = A.shape[0], B.shape[1]
    whole = tile.pop("whole")
    programs = _fused.launch_size(ctx, whole + (tile_count(M, N, tile) - whole) * tile["SPLIT"])
    parts = getattr(workspace, "parts", output)  # unused without a split
    plan = _row_block_plan(ctx, output, M, N, tile["BLOCK_M"], tile["BLOCK_N"]) if copies else None
    launch = bind(
        _matmul_gather_kernel, (programs,),
        A, B, output, bias if bias is not None else output, parts, getattr(workspace, "ready", parts),
        output if plan is None else plan.gates, M, N, A.shape[1], whole, A.stride(0), A.stride(1), B.stride(0),
        B.stride(1), output.stride(0), output.stride(1), *_fused.barrier_arguments(ctx), ALONG_M=along_m,
        HAS_BIAS=bias is not None, UPCAST=ctx.team.backend.upcasts_narrow_floats, WORLD=ctx.get_num_ranks(),
        EXIT_BARRIER=not async_op and plan is None, BARRIER_BLOCK=ctx.team.barrier.block, TRACE=ctx.tracing.enabled,
        TMA=whole > 0 and _fused.tma_loads(ctx, config, A, B), TRIGGERED=plan is not None,
        **tile)  # the whole tiles' loads
    return workspace, [launch if plan is None else plan.around(launch)]


def _refuse_copies(what: str, along_m: bool, config: FusedConfig, output) -> None:
    """FusedConfig(copy_engine=True) sends whole row blocks of matmul_all_gather's output, each tile computed whole."""
    if not along_m:
        raise ValueError(f"{what}: FusedConfig(copy_engine=True) sends whole row blocks by copies; this op's products "
                         "sit side by side in columns. Use copy_engine=None or False")
    if config.split_k is not None and config.split_k > 1:
        raise ValueError(f"{what}: FusedConfig(copy_engine=True and split_k={config.split_k}): a row block goes by "
                         "copies once its tiles are computed whole; pass one or the other")
    if not output.is_contiguous():
        raise ValueError(f"{what}: FusedConfig(copy_engine=True) sends contiguous row blocks; output must be "
                         "contiguous")


def _row_block_plan(ctx, output, M: int, N: int, block_m: int, block_n: int) -> TriggeredPlan:
    """The triggered copies of a call (collective): rank r's row blocks of BLOCK_M rows, each published by its
    tiles_n tiles, to the same rows of every member's output."""
    tiles_n = triton.cdiv(N, block_n)
    schedules = [[((r * M + lo) * N, (r * M + min(lo + block_m, M)) * N, tiles_n) for lo in range(0, M, block_m)]
                 for r in range(ctx.get_num_ranks())]
    return TriggeredPlan(ctx, output, schedules)
