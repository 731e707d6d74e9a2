"""GEMM + one-shot all-reduce: every rank publishes its partial tiles, then reads each tile from every rank and sums.

A row-parallel layer, as in 08: K is split across the ranks and C = sum over ranks of A_r @ B_r.
Here nobody writes into another rank's C. One persistent kernel, per tile:

1. computes this rank's partial tile and stores it in its own heap (``partial``);
2. raises the tile's flag on every rank (``iris.signal``: a block barrier, then a release at system scope): flag
   ``tile * W + rank`` says "rank's partial of this tile is ready";
3. waits for the flags of every rank's partial of the same tile (``iris.wait_until``, acquire), reads
   them all with ``iris.load`` (one shot: every rank reads everything) and writes their sum into its C.

Every rank takes the tiles in the same order, so each waits only for work the others do first. The
flags hold the call's number: nothing to reset between calls.

    iris run -n 2 examples/09_gemm_one_shot_all_reduce/example.py --validate
    python examples/09_gemm_one_shot_all_reduce/example.py --validate --benchmark -r 2
"""

import sys
from pathlib import Path

import torch

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl
from iris.ops.gemm import tile_of, tile_product

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import gemm, utils  # noqa: E402


@triton.jit(do_not_specialize=["call"])  # a new number each call: one compiled kernel for all
def persistent_gemm_one_shot_all_reduce(A, B, partial, C, flags, call, M, N, K, stride_am, stride_ak, stride_bk,
                                        stride_bn, stride_cm, stride_cn, cur_rank, world_size, heap_bases,
                                        BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                                        BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                                        UPCAST: tl.constexpr):
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_SIZE_M)
        acc, rows, cols = tile_product(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n,
                                       UPCAST, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        place = rows[:, None].to(tl.int64) * N + cols[None, :]  # partial is a contiguous float32 (M, N)
        tl.store(partial + place, acc, mask=mask)  # 1. this rank's partial tile, in its own heap
        for i in range(0, world_size):  # 2. "ready" on every rank; signal: every thread's stores first, then release
            iris.signal(flags + tile * world_size + cur_rank, call, cur_rank, (cur_rank + i) % world_size, heap_bases)
        total = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for i in range(0, world_size):  # 3. every rank's partial of this tile, summed here
            peer = (cur_rank + i) % world_size
            iris.wait_until(flags + tile * world_size + peer, "==", call, sem="acquire", scope="sys")
            tl.debug_barrier()  # the acquire before any thread reads the peer's tile
            total += iris.load(partial + place, cur_rank, peer, heap_bases, mask=mask, other=0.0)
        c_place = rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
        tl.store(C + c_place, total.to(C.dtype.element_ty), mask=mask)


def main(args) -> int:
    ctx = iris.iris(args.heap_size or args.m * args.n * 4 + (1 << 24))
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    if args.k % world:
        ctx.error(f"-k {args.k} must be divisible by the {world} ranks")
        return 2
    a, b = gemm.inputs(ctx, args)
    k_local = args.k // world
    local_a = a[:, rank * k_local:(rank + 1) * k_local].contiguous()
    local_b = b[rank * k_local:(rank + 1) * k_local, :].contiguous()
    partial = ctx.zeros(args.m, args.n, dtype=torch.float32)  # on the heap: the other ranks read it
    c = torch.zeros(args.m, args.n, dtype=args.dtype, device=ctx.get_device())  # only this rank writes it
    tiles = triton.cdiv(args.m, args.BLK_M) * triton.cdiv(args.n, args.BLK_N)
    flags = ctx.zeros(tiles * world, dtype=torch.int32)
    grid = (gemm.programs(ctx, args, tiles),)
    calls = [0]

    def run_experiment():
        calls[0] += 1
        persistent_gemm_one_shot_all_reduce[grid](
            local_a, local_b, partial, c, flags, calls[0], args.m, args.n, k_local, local_a.stride(0),
            local_a.stride(1), local_b.stride(0), local_b.stride(1), c.stride(0), c.stride(1), rank, world,
            ctx.get_heap_bases(), BLOCK_SIZE_M=args.BLK_M, BLOCK_SIZE_N=args.BLK_N, BLOCK_SIZE_K=args.BLK_K,
            GROUP_SIZE_M=args.gsize_m, UPCAST=utils.on_cpu(), **gemm.launch_options(args))
        ctx.barrier()  # nobody overwrites its partials while another rank may still read them

    ok = True
    if args.validate:
        c.fill_(float("nan"))  # poison: a tile never summed shows
        ctx.barrier()
        run_experiment()
        ok = utils.all_passed(ctx, gemm.validate(ctx, f"rank {rank}", c, a, b))
    if args.benchmark:
        ms = iris.do_bench(run_experiment, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
        gemm.report(ctx, args, f"GEMM + one-shot all-reduce, {tiles} tiles on {grid[0]} programs", ms)
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, gemm.parse_args(__doc__, blk_n=128)))
