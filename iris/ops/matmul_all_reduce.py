"""matmul_all_reduce: ``output = sum over ranks of A_r @ B_r (+ bias)``, GEMM and all-reduce in one kernel.

The tensor-parallel row-split layer: every rank holds its K-shard, ``A`` (M, K_r) and ``B``
(K_r, N), and every rank gets the whole sum. One persistent kernel per rank; each program, for
each of its output tiles:

1. computes its rank's float32 partial tile (the package GEMM, :func:`iris.ops.gemm.tile_product`);
2. stores it into slot ``index`` of that tile in every member's workspace, then adds 1 to the
   tile's flag on each other member (release);
3. waits until its own flag for the tile has counted every other member (acquire), sums the W
   slots in member order (so every rank gets the same bits), adds the bias and writes ``output``.

Communication of one tile overlaps the GEMM of the next. Before its first store a program passes
a barrier with the programs of the same id on the other ranks (:func:`iris.ccl._device.enter`):
every member's previous call has ended, so nobody still reads a slot about to be overwritten.
Nothing waits after the last tile: each rank's output is complete when its kernel ends.

Example:
    >>> out = torch.empty(M, N, dtype=torch.bfloat16, device=ctx.get_device())
    >>> ctx.ops.matmul_all_reduce(out, A_shard, B_shard, bias=bias)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import iris
from iris.ccl import _common
from iris.ccl._device import enter
from iris.device_barrier import FUSED_PROGRAMS
from iris.ops.gemm import INTERPRETED_TILE, check_operands, tile_count, tile_of, tile_product
from iris.ops.config import FusedConfig
from iris.runtime import interpreted


@triton.jit(do_not_specialize=_common.GROUP_ARGS)
def _matmul_all_reduce_kernel(a, b, out, bias, partials, flags, seen, M, N, K, stride_am, stride_ak, stride_bk,
                              stride_bn, stride_om, stride_on, members, count, index, cur, heap_bases, arrivals,
                              expected, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, WORLD: tl.constexpr,
                              BARRIER_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    enter(arrivals, expected, members, count, cur, heap_bases, WORLD, BARRIER_BLOCK)
    slot_size = tl.cast(M, tl.int64) * N  # partials: [member index][M][N] float32, contiguous
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        acc, rows, cols = tile_product(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n,
                                       UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        place = rows[:, None].to(tl.int64) * N + cols[None, :]
        for i in range(0, count):
            peer = tl.load(members + (index + i) % count)  # start at a different peer on every rank
            iris.store(partials + index * slot_size + place, acc, cur, peer, heap_bases, mask=mask)
        tl.debug_barrier()  # every thread's stores before the flags
        for i in range(1, count):
            peer = tl.load(members + (index + i) % count)
            iris.signal(flags + tile, 1, cur, peer, heap_bases, op="add")
        want = tl.load(seen + tile) + count - 1
        iris.wait_until(flags + tile, ">=", want)
        tl.store(seen + tile, want)
        tl.debug_barrier()  # the acquire before any thread reads the slots
        total = tl.load(partials + place, mask=mask, volatile=True)
        for j in range(1, count):
            total += tl.load(partials + j * slot_size + place, mask=mask, volatile=True)
        if HAS_BIAS:
            total += tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        tl.store(out + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on,
                 total.to(out.dtype.element_ty), mask=mask)


class Workspace:
    """The heap slots and tile flags of :func:`matmul_all_reduce`, for outputs up to a size.

    Args:
        partials: float32 heap tensor of at least W * M * N elements (every rank's slots).
        flags: int64 heap tensor, one zeroed counter per output tile.
        tile: the tile shape these were sized for (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M).

    Every rank makes its workspace at the same point (the heap allocates symmetrically);
    :meth:`allocate` does it for one output shape.
    """

    def __init__(self, partials: torch.Tensor, flags: torch.Tensor, tile: dict):
        self.partials, self.flags, self.tile = partials, flags, tile
        self.seen = torch.zeros_like(flags)  # local: how many tile signals each tile has counted

    @classmethod
    def allocate(cls, ctx, m: int, n: int, tile: dict) -> Workspace:
        return cls(ctx.empty(ctx.get_num_ranks() * m * n, dtype=torch.float32),
                   ctx.zeros(tile_count(m, n, tile), dtype=torch.int64), tile)

    def fits(self, m: int, n: int, world: int) -> bool:
        return self.partials.numel() >= world * m * n and self.flags.numel() >= tile_count(m, n, self.tile)


def _tile(config: FusedConfig) -> dict:
    if interpreted():
        return dict(INTERPRETED_TILE)
    return dict(BLOCK_M=config.block_size_m, BLOCK_N=config.block_size_n, BLOCK_K=config.block_size_k,
                GROUP_M=config.group_size_m)


def matmul_all_reduce_preamble(output, A, B, ctx, config=None) -> Workspace:
    """Check the operands and make the workspace, on every rank at once (it is a heap allocation).

    Pass the result as ``workspace=`` to calls with the same output shape and config.
    """
    config = FusedConfig() if config is None else config
    _check(output, A, B, None, ctx)
    return Workspace.allocate(ctx, output.shape[0], output.shape[1], _tile(config))


def _check(output, A, B, bias, ctx) -> None:
    check_operands("matmul_all_reduce", A, B, output, bias, getattr(output, "dtype", None))
    if A.device != ctx.get_device():
        raise ValueError(f"matmul_all_reduce: the operands are on {A.device}, this rank's device is "
                         f"{ctx.get_device()}")


def matmul_all_reduce(output, A, B, ctx, bias=None, async_op=False, config=None, workspace=None) -> None:
    """``output = sum over ranks of A @ B``, plus ``bias`` once; every rank calls it with its own shards.

    Args:
        output: (M, N), float32, bfloat16 or float16, on this rank's device (need not be on the heap).
        A: (M, K_r) this rank's shard, bfloat16 or float16; B: (K_r, N), the same dtype.
        ctx: the Iris context.
        bias: optional (N,), added once after the sum.
        async_op: accepted for the original API; the call never waits after its last tile (see module).
        config: an :class:`iris.ops.FusedConfig` (the GEMM's tile shape on a GPU).
        workspace: from :func:`matmul_all_reduce_preamble`; made on first use per output shape and
            config otherwise, and kept by ``ctx.ops``.
    """
    config = FusedConfig() if config is None else config
    _check(output, A, B, bias, ctx)
    M, N = output.shape
    if workspace is None:
        workspace = ctx.ops._workspace(output.shape, config, lambda: Workspace.allocate(ctx, M, N, _tile(config)))
    elif workspace.tile != _tile(config) or not workspace.fits(M, N, ctx.get_num_ranks()):
        raise ValueError(f"matmul_all_reduce: the workspace does not fit output {tuple(output.shape)} with this "
                         "config; make one with matmul_all_reduce_preamble(output, A, B, config=config)")
    members = _common.participants(ctx, None)
    barrier = ctx._device_barrier
    arrivals, expected, _, _ = barrier.arguments(None)
    tile = workspace.tile
    programs = min(tile_count(M, N, tile), FUSED_PROGRAMS)  # each program has a barrier slot
    _matmul_all_reduce_kernel[(programs,)](
        A, B, output, bias if bias is not None else output, workspace.partials, workspace.flags, workspace.seen,
        M, N, A.shape[1], A.stride(0), A.stride(1), B.stride(0), B.stride(1), output.stride(0), output.stride(1),
        members.tensor, members.size, members.index, ctx.get_rank(), ctx.get_heap_bases(), arrivals, expected,
        HAS_BIAS=bias is not None, UPCAST=interpreted(), WORLD=ctx.get_num_ranks(),
        BARRIER_BLOCK=barrier.block, num_warps=config.num_warps, num_stages=config.num_stages, **tile)
