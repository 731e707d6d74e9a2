"""Tile collectives in your own kernel: a GEMM whose epilogue all-reduces each tile with ``iris.x``.

Every rank holds a slice of K (A: M x K_local, B: K_local x N) and computes partial C tiles with ``tl.dot``
(on Hopper, A and B tiles come through TMA tensor descriptors); in the same kernel each tile is published on
the symmetric heap (``iris.x.publish_tile``: stored, then its flag set with release) and summed over the
ranks, so every rank ends with C = sum of the partial products without a separate collective launch. With
``--epilogue two_shot`` (the default) rank r sums tiles r, r + world, ... (``iris.x.all_reduce_two_shot``:
each peer's tile read once its flag says so) and stores each sum on every rank; with ``one_shot`` every rank
sums every tile (``iris.x.all_reduce_one_shot``). The grid is one program per tile, taken in groups of
--group-m tile rows (neighbouring programs share rows of A and columns of B in the L2 cache); a program waits
only on the same tile of its peers, which every rank computes in the same order and publishes before it waits.

    iris run -n 2 examples/17_gemm_all_reduce_epilogue/example.py --validate
    python examples/17_gemm_all_reduce_epilogue/example.py --validate --benchmark -r 2
"""

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import iris
import iris.x
from iris.ops.gemm import tile_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit(do_not_specialize=["call"])  # a new number each call: one compiled kernel for all
def gemm_all_reduce(a, b, partial, c, locks, context, M, N, K, call, RANK: tl.constexpr, WORLD: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                    TMA: tl.constexpr, EPILOGUE: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, RANK, WORLD)
    # program -> tile: GROUP_M tile rows at a time, down each column of tiles of the group, then the next group
    pid_m, pid_n = tile_of(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:  # Hopper's bulk tile loads through tensor descriptors (zeros past the edges)
        a_tiles = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_tiles = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            acc = tl.dot(a_tiles.load([pid_m * BLOCK_M, k * BLOCK_K]), b_tiles.load([k * BLOCK_K, pid_n * BLOCK_N]),
                         acc)
    else:
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            rk = k * BLOCK_K + tl.arange(0, BLOCK_K)
            x = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            y = tl.load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
            acc = tl.dot(x, y, acc)
    # the epilogue: this tile's partial, summed over the ranks
    tile = iris.x.Tile(pid_m, pid_n, BLOCK_M, BLOCK_N, acc)
    partials = iris.x.make_tensor_view(partial, M, N, N, 1)
    output = iris.x.make_tensor_view(c, M, N, N, 1)
    if EPILOGUE == "none":  # the GEMM alone (for timing): this rank's partial product
        ptrs, mask = output.tile_ptr(tile)
        tl.store(ptrs, acc.to(c.dtype.element_ty), mask=mask)
    else:
        iris.x.publish_tile(tile, partials, locks, ctx, call)  # flags hold the call's number: nothing to reset
        if EPILOGUE == "one_shot":  # every rank sums every tile, reading its peers' partials
            iris.x.all_reduce_one_shot(tile, partials, output, locks, ctx, call)
        else:  # two_shot: rank r sums tiles r, r + WORLD, ... and stores each sum on every rank
            iris.x.all_reduce_two_shot(tile, partials, output, locks, RANK, WORLD, ctx, call)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cpu = utils.on_cpu()
    parser.add_argument("-m", type=int, default=64 if cpu else 4096, help="rows of A and C")
    parser.add_argument("-n", type=int, default=64 if cpu else 4096, help="columns of B and C")
    parser.add_argument("-k", type=int, default=64 if cpu else 8192, help="K of each rank (its slice)")
    parser.add_argument("--block", type=int, default=32 if cpu else 128, help="BLOCK_M (and BLOCK_N unless given)")
    parser.add_argument("--block-n", type=int, default=None if cpu else 256, help="BLOCK_N (default: --block)")
    parser.add_argument("--block-k", type=int, default=32 if cpu else 64, help="BLOCK_K")
    parser.add_argument("--group-m", type=int, default=8, help="tile rows taken together (L2 reuse)")
    parser.add_argument("--num-warps", type=int, default=4 if cpu else 8, help="warps per program")
    parser.add_argument("--num-stages", type=int, default=1 if cpu else 3, help="software pipeline stages")
    parser.add_argument("--epilogue", default="two_shot", choices=["one_shot", "two_shot"],
                        help="one_shot: every rank sums every tile; two_shot: one rank sums a tile, sends it to all")
    parser.add_argument("--tma", action=argparse.BooleanOptionalAction, default=utils.hopper_or_newer(),
                        help="load A and B tiles through TMA tensor descriptors (NVIDIA Hopper and newer)")
    utils.add_check_and_timing_args(parser, "A, B and C", "torch.matmul + ctx.ccl.all_reduce", runs=50, warmup=10)
    return utils.add_common_args(parser).parse_args()


def main(args) -> int:
    dtype, m, n, k = utils.torch_dtype(args.datatype), args.m, args.n, args.k
    if args.tma and (k * dtype.itemsize % 16 or n * dtype.itemsize % 16):
        raise SystemExit(f"--tma: TMA descriptors need rows of A and B in multiples of 16 bytes; got K {k} and N {n} "
                         f"of {args.datatype}: use --no-tma")
    ctx = iris.iris(4 * (m * k + k * n + 3 * m * n) * 4 + (1 << 24))
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    g = torch.Generator().manual_seed(1234 + rank)
    a = ctx.empty(m, k, dtype=dtype)
    b = ctx.empty(k, n, dtype=dtype)
    a.copy_(torch.randn(m, k, generator=g).to(dtype))
    b.copy_(torch.randn(k, n, generator=g).to(dtype))
    partial, c = ctx.zeros(m, n, dtype=dtype), ctx.zeros(m, n, dtype=dtype)
    block_n = args.block_n or args.block
    tiles = triton.cdiv(m, args.block) * triton.cdiv(n, block_n)
    locks = ctx.zeros(tiles, dtype=torch.int32)
    calls = [0]
    if args.tma:  # the tensor descriptors need scratch memory from Triton's allocator
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=a.device))

    def launch(epilogue):
        calls[0] += 1
        gemm_all_reduce[(tiles,)](a, b, partial, c, locks, ctx.get_device_context(), m, n, k, calls[0], RANK=rank,
                                  WORLD=world, BLOCK_M=args.block, BLOCK_N=block_n, BLOCK_K=args.block_k,
                                  GROUP_M=args.group_m, TMA=args.tma, EPILOGUE=epilogue, num_warps=args.num_warps,
                                  num_stages=args.num_stages)

    def fused():
        launch(args.epilogue)
        ctx.device_barrier()  # no rank reuses partial before every peer has read it (two_shot: its sums arrived)

    ok = True
    if args.validate:
        ctx.barrier()
        fused()
        fused()  # again: the second call reuses the flags and buffers of the first
        ctx.barrier()
        products = torch.zeros(m, n, dtype=torch.float64)
        for r in range(world):  # every rank's partial product, from its seed
            gr = torch.Generator().manual_seed(1234 + r)
            ar, br = torch.randn(m, k, generator=gr).to(dtype), torch.randn(k, n, generator=gr).to(dtype)
            products += ar.double() @ br.double()
        error = ((c.cpu().double() - products).norm() / products.norm()).item()
        ok = utils.all_passed(ctx, error < (1e-5 if dtype == torch.float32 else 2e-2))
        ctx.log(f"GEMM + tile all-reduce of {m} x {n} x {k} per rank: relative error {error:.2e}, validation "
                f"{'passed' if ok else 'FAILED'}")
    if args.benchmark:
        fused_ms = iris.do_bench(fused, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
        out = ctx.empty(m, n, dtype=dtype)

        def separate():
            torch.matmul(a, b, out=partial)
            ctx.ccl.all_reduce(out, partial)

        separate_ms = iris.do_bench(separate, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
        gemm_ms = iris.do_bench(lambda: launch("none"), ctx.barrier, n_warmup=args.num_warmup,
                                n_repeat=args.num_experiments)
        matmul_ms = iris.do_bench(lambda: torch.matmul(a, b, out=partial), ctx.barrier, n_warmup=args.num_warmup,
                                  n_repeat=args.num_experiments)
        if rank == 0:
            ctx.log_stats(f"GEMM + iris.x {args.epilogue} epilogue {fused_ms * 1e3:.1f} us, torch.matmul + "
                          f"ctx.ccl.all_reduce {separate_ms * 1e3:.1f} us; the GEMM alone {gemm_ms * 1e3:.1f} us, "
                          f"torch.matmul alone {matmul_ms * 1e3:.1f} us ({world} ranks, {m} x {n} x {k} "
                          f"{args.datatype}, {args.block} x {block_n} x {args.block_k} tiles, TMA {args.tma})")
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
