"""GEMM + all-scatter: every rank computes its column block of C = A @ B and stores each tile into every rank.

A column-parallel layer whose output every rank needs: every rank holds all of A (M, K) and the
columns ``[rank * N / W, (rank + 1) * N / W)`` of B. One persistent kernel computes this rank's
tiles of C; as soon as a tile is done, the program that computed it stores it with ``iris.store``
into the same place of C on every rank, so communication overlaps the rest of the GEMM. After a
barrier every rank holds all of C. (``ctx.ops.gemm_all_scatter`` is the library's version of it; 10,
11 and 12 are other ways to overlap the same work.)

    iris run -n 2 examples/07_gemm_all_scatter/example.py --validate
    python examples/07_gemm_all_scatter/example.py --validate --benchmark -r 2
"""

import sys
from pathlib import Path

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl
from iris.ops.gemm import tile_of, tile_product

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import gemm, utils  # noqa: E402


@triton.jit
def persistent_gemm_all_scatter(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                                cur_rank, world_size, heap_bases, BLOCK_SIZE_M: tl.constexpr,
                                BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
                                UPCAST: tl.constexpr):
    """N is this rank's share of C's columns; its tiles go to columns ``cur_rank * N + ...`` of C everywhere."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_SIZE_M)
        acc, rows, cols = tile_product(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n,
                                       UPCAST, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        value = acc.to(C.dtype.element_ty)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        place = rows[:, None].to(tl.int64) * stride_cm + (cur_rank * N + cols[None, :]) * stride_cn
        for i in range(0, world_size):  # every rank starts with a different peer
            iris.store(C + place, value, cur_rank, (cur_rank + i) % world_size, heap_bases, mask=mask)


def main(args) -> int:
    ctx = iris.iris(args.heap_size or 2 * args.m * args.n * 4 + (1 << 24))
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    if args.n % world:
        ctx.error(f"-n {args.n} must be divisible by the {world} ranks")
        return 2
    a, b = gemm.inputs(ctx, args)
    n_local = args.n // world
    local_b = b[:, rank * n_local:(rank + 1) * n_local].contiguous()
    c = ctx.zeros(args.m, args.n, dtype=args.dtype)  # on the heap: every rank stores into it
    tiles = triton.cdiv(args.m, args.BLK_M) * triton.cdiv(n_local, args.BLK_N)
    grid = (gemm.programs(ctx, args, tiles),)

    def run_experiment():
        persistent_gemm_all_scatter[grid](
            a, local_b, c, args.m, n_local, args.k, a.stride(0), a.stride(1), local_b.stride(0), local_b.stride(1),
            c.stride(0), c.stride(1), rank, world, ctx.get_heap_bases(), BLOCK_SIZE_M=args.BLK_M,
            BLOCK_SIZE_N=args.BLK_N, BLOCK_SIZE_K=args.BLK_K, GROUP_SIZE_M=args.gsize_m, UPCAST=utils.on_cpu(),
            **gemm.launch_options(args))
        ctx.barrier()  # every rank's tiles have landed in every C

    ok = True
    if args.validate:
        c.fill_(float("nan"))  # poison: a tile nobody stored shows
        ctx.barrier()
        run_experiment()
        ok = utils.all_passed(ctx, gemm.validate(ctx, f"rank {rank}", c, a, b))
    if args.benchmark:
        ms = iris.do_bench(run_experiment, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
        gemm.report(ctx, args, f"GEMM + all-scatter, {tiles} tiles per rank on {grid[0]} programs", ms)
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, gemm.parse_args(__doc__, blk_n=64)))
