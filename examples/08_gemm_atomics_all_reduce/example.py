"""GEMM + all-reduce by atomics: every rank adds its partial product, tile by tile, into C on every rank.

A row-parallel layer: K is split across the ranks; rank r holds the columns ``[r * K / W, (r + 1) *
K / W)`` of A and the same rows of B, so C = A @ B is the sum over ranks of A_r @ B_r. One
persistent kernel computes this rank's partial tiles and, as each is done, adds it into the same
tile of C on every rank with ``iris.atomic_add`` (``sem="relaxed"``: only the sum matters;
``scope="sys"``: other GPUs add into the same words). C starts at zero before every call and is
float32: float32 atomic adds run everywhere (the CPU backend cannot add fp16 or bf16 atomically
across processes).

    iris run -n 2 examples/08_gemm_atomics_all_reduce/example.py --validate
    python examples/08_gemm_atomics_all_reduce/example.py --validate --benchmark -r 2
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


@triton.jit
def persistent_gemm_atomics_all_reduce(A, B, C, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                                       stride_cn, cur_rank, world_size, heap_bases, BLOCK_SIZE_M: tl.constexpr,
                                       BLOCK_SIZE_N: tl.constexpr, BLOCK_SIZE_K: tl.constexpr,
                                       GROUP_SIZE_M: tl.constexpr, UPCAST: tl.constexpr):
    """K is this rank's share of the depth; its partial tiles are added into C on every rank."""
    tiles_m, tiles_n = tl.cdiv(M, BLOCK_SIZE_M), tl.cdiv(N, BLOCK_SIZE_N)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_SIZE_M)
        acc, rows, cols = tile_product(A, B, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n,
                                       UPCAST, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        place = rows[:, None].to(tl.int64) * stride_cm + cols[None, :] * stride_cn
        for i in range(0, world_size):  # every rank starts with a different peer
            iris.atomic_add(C + place, acc, cur_rank, (cur_rank + i) % world_size, heap_bases, mask=mask,
                            sem="relaxed", scope="sys")


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
    c = ctx.zeros(args.m, args.n, dtype=torch.float32)  # on the heap: every rank adds into it
    tiles = triton.cdiv(args.m, args.BLK_M) * triton.cdiv(args.n, args.BLK_N)
    grid = (gemm.programs(ctx, args, tiles),)

    def preamble():
        iris.memset_tensor(c, 0)  # the sum starts from zero; do_bench lines the ranks up after it

    def run_experiment():
        persistent_gemm_atomics_all_reduce[grid](
            local_a, local_b, c, args.m, args.n, k_local, local_a.stride(0), local_a.stride(1), local_b.stride(0),
            local_b.stride(1), c.stride(0), c.stride(1), rank, world, ctx.get_heap_bases(),
            BLOCK_SIZE_M=args.BLK_M, BLOCK_SIZE_N=args.BLK_N, BLOCK_SIZE_K=args.BLK_K, GROUP_SIZE_M=args.gsize_m,
            UPCAST=utils.on_cpu(), **gemm.launch_options(args))
        ctx.barrier()  # every rank's partial tiles have been added everywhere

    ok = True
    if args.validate:
        preamble()
        ctx.barrier()
        run_experiment()
        ok = utils.all_passed(ctx, gemm.validate(ctx, f"rank {rank}", c, a, b))
    if args.benchmark:
        ms = iris.do_bench(run_experiment, ctx.barrier, preamble, n_warmup=args.num_warmup,
                           n_repeat=args.num_experiments)
        gemm.report(ctx, args, f"GEMM + all-reduce (atomics), {tiles} tiles on {grid[0]} programs", ms)
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, gemm.parse_args(__doc__, blk_n=128)))
