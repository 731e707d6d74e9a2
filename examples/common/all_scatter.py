"""What the three GEMM + all-scatter examples share: the problem, the Triton pieces, --validate, --benchmark.

The problem (a column-parallel layer whose outputs every rank needs): every rank holds the same
A (M, K) and its own column shard B_r (K, N / W); every rank must end with C = [A @ B_0 | ... |
A @ B_{W-1}] (M, N) in its heap. Each example computes A @ B_r tile by tile with the package's
GEMM pieces (iris.ops.gemm) and *scatters* every tile into every rank's C with ``iris.store``;
they differ in how the scatter overlaps the GEMM:

    bulk_synchronous.py          GEMM kernel, then scatter kernel, then barrier: no overlap
    producer_consumer.py         a GEMM kernel and a scatter kernel on two streams, at once,
                                 tile flags between them
    workgroup_specialization.py  one kernel: some programs compute tiles, the others scatter them

(``ctx.ops.gemm_all_scatter`` is a fourth: every program scatters the tile it just computed.)
"""

import argparse
import statistics

import torch
import torch.distributed as dist
import triton
import triton.language as tl

import iris
from iris.ops import FusedConfig, sm_share
from iris.ops.gemm import INTERPRETED_TILE, tile_count, tile_of, tile_product
from iris.runtime import interpreted

# The fused ops' default tile and launch (FusedConfig), or the interpreter's small tile on the CPU backend.
_FUSED = FusedConfig()
TILE = dict(INTERPRETED_TILE) if interpreted() else \
    dict(BLOCK_M=_FUSED.block_size_m, BLOCK_N=_FUSED.block_size_n, BLOCK_K=_FUSED.block_size_k,
         GROUP_M=_FUSED.group_size_m)
LAUNCH = {} if interpreted() else dict(num_warps=_FUSED.num_warps, num_stages=_FUSED.num_stages)


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
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--m", type=int, default=8192 if gpu else 64)
    parser.add_argument("--n", type=int, default=8192 if gpu else 64, help="C's columns, all ranks together")
    parser.add_argument("--k", type=int, default=8192 if gpu else 32)
    parser.add_argument("--comm-programs", type=int, default=16 if gpu else 2,
                        help="programs that scatter (producer_consumer, workgroup_specialization)")
    parser.add_argument("--validate", action="store_true", help="exit non-zero when C is wrong")
    parser.add_argument("--benchmark", action="store_true", help="time it beside torch.matmul + NCCL all_gather")
    parser.add_argument("--iters", type=int, default=20 if gpu else 2)
    parser.add_argument("--trace", default=None, metavar="FILE",
                        help="traced.py: write the first call's timeline, all ranks, to FILE (Chrome trace JSON)")
    return parser.parse_args()


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


def run(doc: str, pattern) -> int:
    """Parse the arguments, run ``pattern(problem, args)`` once, then --validate and --benchmark it."""
    args = parse_args(doc)
    ctx = iris.iris(heap_size=max(1 << 26, 4 * args.m * args.n + (1 << 24)))
    p = Problem(ctx, args)
    pattern(p, args)
    ctx.barrier()
    status = 0
    if args.validate:
        blocks = [torch.empty_like(p.B[:1, :1].expand(p.M, p.N)) for _ in range(p.world)]
        dist.all_gather(blocks, (p.A.float() @ p.B.float()).to(torch.bfloat16).contiguous())
        want = torch.cat(blocks, dim=1).float()
        error = ((p.C.float() - want).norm() / want.norm()).item()
        ok = error < 1e-2
        print(f"rank {p.rank}: C is {p.M} x {p.N * p.world}; relative error {error:.2e} against torch: "
              f"{'ok' if ok else 'WRONG'}")
        status = 0 if ok else 1
    if args.benchmark and interpreted():
        if p.rank == 0:
            print("--benchmark: skipped on the CPU backend (the interpreter's times say nothing about overlap)")
    elif args.benchmark:
        iris_us = _median_us(lambda: pattern(p, args), args.iters, ctx)
        gathered = torch.empty(p.world * p.M, p.N, dtype=torch.bfloat16, device=ctx.get_device())

        def torch_nccl():
            dist.all_gather_into_tensor(gathered, torch.matmul(p.A, p.B))
            return gathered.view(p.world, p.M, p.N).permute(1, 0, 2).reshape(p.M, -1)

        torch_us = _median_us(torch_nccl, args.iters, ctx)
        if p.rank == 0:
            print(f"{doc.splitlines()[0].split(':')[0]}: {iris_us:.1f} us; torch.matmul + NCCL all_gather "
                  f"{torch_us:.1f} us ({torch_us / iris_us:.2f}x); M={p.M} N={p.N * p.world} K={p.K}")
    ctx.barrier()
    ctx.close()
    return status


def _median_us(fn, iters: int, ctx) -> float:
    for _ in range(2):
        fn()
    ctx.barrier()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return ctx.broadcast(statistics.median(s.elapsed_time(e) * 1e3 for s, e in events), src=0)
