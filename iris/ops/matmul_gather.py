"""GEMM whose output tiles go straight to every rank: ``matmul_all_gather`` and ``gemm_all_scatter``.

Every rank computes its own product ``A_r @ B_r`` (+ ``bias``) and every rank receives all of
them, placed side by side in its heap ``output``:

- ``matmul_all_gather``: A (M, K), B (K, N); output (W * M, N), rank r's rows at ``r * M``
  (the sequence-parallel gather of a column-parallel layer's input, done after the GEMM);
- ``gemm_all_scatter``: A (M, K), B (K, N) this rank's column shard; output (M, W * N), rank r's
  columns at ``r * N`` (the paper's GEMM + all-scatter).

One persistent kernel per rank. Each program computes a tile and stores it, in the output dtype,
into every member's output (its own included) straight from registers, so a tile's transfer
overlaps the next tile's GEMM. Program ``p`` passes a barrier with program ``p`` of every member
before its first store (every member's previous use of its output has ended) and after its last
(unless ``async_op``): when a rank's kernel ends, every rank's tiles have landed in its output.
With ``async_op=True`` call ``ctx.device_barrier()`` (or ``ctx.barrier()``) before reading it.

Example:
    >>> W = ctx.get_num_ranks()
    >>> out = ctx.empty(W * M, N, dtype=torch.bfloat16)        # on the heap: peers write into it
    >>> ctx.ops.matmul_all_gather(out, A, B)
    >>> scattered = ctx.empty(M, W * N_shard, dtype=torch.bfloat16)
    >>> ctx.ops.gemm_all_scatter(scattered, A, B_shard)
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris.ccl.all_gather import store_to_members
from iris.device import tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes
from iris.kernel_launch import bind
from iris.ops import _fused
from iris.ops.config import FusedConfig
from iris.ops.gemm import add_bias, operand, tile_count, tile_of, tile_product


@triton.jit(do_not_specialize=GROUP_ARGS)
def _matmul_gather_kernel(a, b, out, bias, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
                          members, count, index, cur, heap_bases, arrivals, expected, ALONG_M: tl.constexpr,
                          HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, WORLD: tl.constexpr,
                          EXIT_BARRIER: tl.constexpr, BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr,
                          TMA: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    a_tiles = operand(a, M, K, stride_am, TMA, BLOCK_M, BLOCK_K)
    b_tiles = operand(b, K, N, stride_bk, TMA, BLOCK_K, BLOCK_N)
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, True, BARRIER_BLOCK, TRACE)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        span = trace.start(tracing.COMPUTE, cur, cur, out, tile_m, tile_n, 0)
        acc, rows, cols = tile_product(a_tiles, b_tiles, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_m,
                                       tile_n, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
        trace.end(span)
        acc = add_bias(acc, bias, cols, N, HAS_BIAS)
        value = acc.to(out.dtype.element_ty)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        if ALONG_M:
            place = (rows[:, None] + index * M).to(tl.int64) * stride_om + cols[None, :] * stride_on
        else:
            place = rows[:, None].to(tl.int64) * stride_om + (cols[None, :] + index * N) * stride_on
        span = trace.start(tracing.PUT, cur, -1, out, tile_m, tile_n, elements_bytes(out, count * BLOCK_M * BLOCK_N))
        # into every member, from a different one on every rank; across nodes as block puts (one per row)
        store_to_members(out + place, value, members, count, index, cur, heap_bases, mask, 0)
        trace.end(span)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def _output_shape(along_m: bool, world: int):
    return lambda M, K, N: (world * M, N) if along_m else (M, world * N)


def preamble(what: str, along_m: bool, ctx, output, A, B, config=None) -> _fused.Workspace:
    """Check the operands; these ops keep no workspace (the output is the only buffer peers write)."""
    _fused.check(what, ctx, output, A, B, None, _output_shape(along_m, ctx.get_num_ranks()), symmetric_output=True)
    return _fused.Workspace((what,), {})


def run(what: str, along_m: bool, ctx, output, A, B, bias=None, async_op=False, config=None,
        workspace=None) -> tuple:
    """One call of ``what`` (see the module): checks; returns the workspace it uses and its
    launch, bound (:mod:`iris.kernel_launch`), not yet launched: ``ctx.ops`` launches and replays it."""
    config = FusedConfig() if config is None else config
    _fused.check(what, ctx, output, A, B, bias, _output_shape(along_m, ctx.get_num_ranks()), symmetric_output=True)
    workspace = _fused.workspace_for(ctx, what, (what,), {}, workspace)
    M, N = A.shape[0], B.shape[1]
    tile = _fused.tile(ctx, config, A.dtype, M, N)
    programs = _fused.launch_size(ctx, tile_count(M, N, tile))
    launch = bind(
        _matmul_gather_kernel, (programs,),
        A, B, output, bias if bias is not None else output, M, N, A.shape[1], A.stride(0), A.stride(1), B.stride(0),
        B.stride(1), output.stride(0), output.stride(1), *_fused.barrier_arguments(ctx), ALONG_M=along_m,
        HAS_BIAS=bias is not None, UPCAST=ctx.team.backend.interpreted, WORLD=ctx.get_num_ranks(),
        EXIT_BARRIER=not async_op, BARRIER_BLOCK=ctx.team.barrier.block, TRACE=ctx.tracing.enabled,
        TMA=_fused.tma_loads(ctx, config, A, B), **tile)
    return workspace, [launch]
