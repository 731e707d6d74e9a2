"""What the GEMM + all-scatter variants (10, 11, 12, 15) share: the problem, the Triton pieces, --validate, --benchmark.

The problem (a column-parallel layer whose outputs every rank needs): every rank holds the same
A (M, K) and its own column shard B_r (K, N / W); every rank must end with C = [A @ B_0 | ... |
A @ B_{W-1}] (M, N) in its heap. Each example computes A @ B_r tile by tile with the package's
GEMM pieces (iris.ops.gemm) and *scatters* every tile into every rank's C with ``iris.store``;
they differ in how the scatter overlaps the GEMM:

    12_gemm_all_scatter_bulk_synchronous    GEMM kernel, then scatter kernel, then barrier: no overlap
    11_gemm_all_scatter_producer_consumer   a GEMM kernel and a scatter kernel on two streams, at once,
                                            tile flags between them
    10_gemm_all_scatter_wg_specialization   one kernel: some programs compute tiles, the others scatter them

(07_gemm_all_scatter and ``ctx.ops.gemm_all_scatter`` are a fourth: every program scatters the tile
it just computed; 15_gemm_all_scatter_tracing records that one's timeline.)
"""

import argparse
import functools

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris
from iris.ops import FusedConfig, sm_share
from iris.ops.gemm import INTERPRETED_TILE, tile_count, tile_of, tile_product
from iris.runtime import interpreted

from common.utils import add_common_args, all_passed, run as run_ranks

# The fused ops' default tile and launch (FusedConfig), or the interpreter's small tile on the CPU backend.
_FUSED = FusedConfig()
TILE = dict(INTERPRETED_TILE) if interpreted() else \
    dict(BLOCK_M=_FUSED.block_size_m, BLOCK_N=_FUSED.block_size_n, BLOCK_K=_FUSED.block_size_k,
         GROUP_M=_FUSED.group_size_m)
# The original's launch options, AMD's included: Iris drops those with one warning on NVIDIA and the CPU backend.
LAUNCH = dict(num_warps=_FUSED.num_warps, num_stages=_FUSED.num_stages, waves_per_eu=0, matrix_instr_nonkdim=16,
              kpack=1)


@triton.jit
def compute_tile(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile, UPCAST: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """(float32 tile ``tile`` of A @ B_r, its rows, its columns), tiles in grouped order."""
    tile_m, tile_n = tile_of(tile, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    return tile_product(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n, UPCAST,
                        BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def scatter_tile(c, value, rows, cols, M, N, stride_cm, stride_cn, rank, world, heap_bases):
    """Store a tile of this rank's (M, N) block into columns ``rank * N + cols`` of C on every rank."""
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    place = rows[:, None].to(tl.int64) * stride_cm + (rank * N + cols[None, :]) * stride_cn
    for i in range(0, world):  # start with a different rank on every rank
        iris.store(c + place, value, rank, (rank + i) % world, heap_bases, mask=mask)


@triton.jit
def local_tile(local, tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(tile ``tile`` of the local (M, N) result, its rows, its columns)."""
    tile_m, tile_n = tile_of(tile, tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    return tl.load(local + rows[:, None].to(tl.int64) * N + cols[None, :], mask=mask), rows, cols


def parse_args(doc: str) -> argparse.Namespace:
    gpu = not interpreted()
    parser = argparse.ArgumentParser(description=doc.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-m", "--m", type=int, default=8192 if gpu else 64, help="rows of A and C")
    parser.add_argument("-n", "--n", type=int, default=8192 if gpu else 64, help="C's columns, all ranks together")
    parser.add_argument("-k", "--k", type=int, default=8192 if gpu else 32, help="columns of A, rows of B")
    parser.add_argument("--comm-programs", "--comm_sms", type=int, default=16 if gpu else 2,
                        help="programs that scatter (10 and 11)")
    parser.add_argument("-v", "--validate", action="store_true", help="check C against torch; exit non-zero if wrong")
    parser.add_argument("-b", "--benchmark", action="store_true",
                        help="time it with iris.do_bench beside torch.matmul + NCCL all_gather")
    parser.add_argument("--iters", "--num_experiments", type=int, default=20 if gpu else 2, help="timed runs")
    parser.add_argument("--trace", default=None, metavar="FILE",
                        help="15: write the first call's timeline, all ranks, to FILE (Chrome trace JSON)")
    return add_common_args(parser).parse_args()


class Problem:
    """A (M, K) the same on every rank, B_r (K, N / W), C (M, N) on the heap, the tile count and SM share."""

    def __init__(self, ctx, args):
        world, rank, device = ctx.get_num_ranks(), ctx.get_rank(), ctx.get_device()
        if args.n % world:
            raise SystemExit(f"--n {args.n} must be divisible by the {world} ranks")
        self.ctx, self.world, self.rank = ctx, world, rank
        self.M, self.N, self.K = args.m, args.n // world, args.k
        shared = torch.Generator(device=device).manual_seed(7)
        own = torch.Generator(device=device).manual_seed(100 + rank)
        self.A = (torch.randn(self.M, self.K, generator=shared, device=device) / self.K ** 0.5).to(torch.bfloat16)
        self.B = torch.randn(self.K, self.N, generator=own, device=device).to(torch.bfloat16)
        self.C = ctx.zeros(self.M, args.n, dtype=torch.bfloat16)
        self.local = torch.empty(self.M, self.N, dtype=torch.bfloat16, device=device)  # this rank's block
        self.tiles = tile_count(self.M, self.N, TILE)
        self.sms = 1 if interpreted() else sm_share(ctx)  # this rank's SMs (a share of them in simulation)
        self.calls = 0  # producer/consumer flags count calls, so they need no reset

    def next_call(self, comm_programs: int) -> tuple[int, int]:
        """(compute programs, communication programs) for the next call; counts the call for the tile flags."""
        if not hasattr(self, "flags"):
            self.flags = torch.zeros(self.tiles, dtype=torch.int32, device=self.ctx.get_device())
        self.calls += 1
        comm = max(1, min(comm_programs, self.tiles))
        return max(1, min(self.sms - comm, self.tiles)), comm

    def gemm_args(self):
        return (self.A, self.B, self.M, self.N, self.K, self.A.stride(0), self.A.stride(1), self.B.stride(0),
                self.B.stride(1))

    def c_args(self):
        return (self.C, self.M, self.N, self.C.stride(0), self.C.stride(1), self.rank, self.world,
                self.ctx.get_heap_bases())


# torch 2.11 renamed all_gather_into_tensor (a deprecation warning); older releases have only that name.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def run(doc: str, pattern) -> int:
    """Parse the arguments, then on every rank (spawned here without a launcher) run ``pattern(problem,
    args)`` once, --validate and --benchmark it."""
    return run_ranks(functools.partial(_main, doc, pattern), parse_args(doc))


def _main(doc: str, pattern, args) -> int:
    ctx = iris.iris(heap_size=max(1 << 26, 4 * args.m * args.n + (1 << 24)))
    p = Problem(ctx, args)
    pattern(p, args)
    ctx.barrier()
    ok = True
    if args.validate:
        blocks = [torch.empty_like(p.B[:1, :1].expand(p.M, p.N)) for _ in range(p.world)]
        dist.all_gather(blocks, (p.A.float() @ p.B.float()).to(torch.bfloat16).contiguous())
        want = torch.cat(blocks, dim=1).double()
        error = ((p.C.double() - want).norm() / want.norm()).item()
        ok = error < 1e-2
        (ctx.log if ok else ctx.error)(f"C is {p.M} x {p.N * p.world}; relative error {error:.2e} against torch: "
                                       f"{'passed' if ok else 'FAILED'}")
        ok = all_passed(ctx, ok)
    if args.benchmark:
        iris_ms = iris.do_bench(lambda: pattern(p, args), ctx.barrier, n_warmup=2, n_repeat=args.iters)
        gathered = torch.empty(p.world * p.M, p.N, dtype=torch.bfloat16, device=ctx.get_device())

        def torch_nccl():
            _all_gather(gathered, torch.matmul(p.A, p.B))
            return gathered.view(p.world, p.M, p.N).permute(1, 0, 2).reshape(p.M, -1)

        torch_ms = iris.do_bench(torch_nccl, ctx.barrier, n_warmup=2, n_repeat=args.iters)
        if p.rank == 0:
            note = " (the CPU backend: Triton's interpreter; nothing about overlap)" if interpreted() else ""
            ctx.log_stats(f"{doc.splitlines()[0].split(':')[0]}: {iris_ms * 1e3:.1f} us; torch.matmul + "
                          f"{dist.get_backend()} all_gather {torch_ms * 1e3:.1f} us ({torch_ms / iris_ms:.2f}x); "
                          f"M={p.M} N={p.N * p.world} K={p.K}{note}")
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1
