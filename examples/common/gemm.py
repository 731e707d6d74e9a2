"""What the GEMM examples (07-09) share: the original's flags, the launch options, the float64 check.

The launch options are the original's, AMD's included (``waves_per_eu``, ``matrix_instr_nonkdim``,
``kpack``): on an AMD GPU they reach Triton; on NVIDIA and on the CPU backend Iris drops them with
one warning each (``IRIS_QUIET_AMD_OPTIONS=1`` silences it), so a program written for the original
runs unchanged.
"""

from __future__ import annotations

import argparse

import torch

from common.utils import DTYPES, add_common_args, on_cpu

TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2, torch.float32: 1e-2}  # relative; fp32 dots may run as tf32


def parse_args(doc: str, blk_n: int) -> argparse.Namespace:
    """The original's GEMM flags; small sizes and tiles by default on the CPU backend."""
    cpu = on_cpu()
    parser = argparse.ArgumentParser(description=doc.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-m", type=int, default=64 if cpu else 8192, help="rows of A and C")
    parser.add_argument("-n", type=int, default=64 if cpu else 4608, help="columns of B and C")
    parser.add_argument("-k", type=int, default=64 if cpu else 36864, help="columns of A, rows of B")
    parser.add_argument("-v", "--validate", action="store_true", help="check C against torch; exit non-zero if wrong")
    parser.add_argument("-b", "--benchmark", action="store_true", help="time it with iris.do_bench")
    parser.add_argument("--datatype", default="fp16", choices=["fp16", "bf16", "fp32"], help="type of A, B and C")
    parser.add_argument("--BLK_M", type=int, default=32 if cpu else 256, help="tile rows")
    parser.add_argument("--BLK_N", type=int, default=32 if cpu else blk_n, help="tile columns")
    parser.add_argument("--BLK_K", type=int, default=32 if cpu else 64, help="tile depth")
    parser.add_argument("--gsize_m", type=int, default=4 if cpu else 6, help="tiles grouped along M (L2 reuse)")
    parser.add_argument("--heap_size", type=int, default=None, help="heap bytes (default: what the buffers need)")
    parser.add_argument("--gemm_sms", type=int, default=None,
                        help="persistent programs (default: the GPU's SMs/CUs; 2 on the CPU backend)")
    parser.add_argument("--num_stages", type=int, default=2, help="software pipeline stages")
    parser.add_argument("--num_warps", type=int, default=8, help="warps per program")
    parser.add_argument("--waves_per_eu", type=int, default=0, help="AMD only: occupancy hint")
    parser.add_argument("--mfmaInstrSize", type=int, default=16, help="AMD only: matrix_instr_nonkdim")
    parser.add_argument("--kpack", type=int, default=1, help="AMD only: K packing")
    parser.add_argument("--num_experiments", type=int, default=2 if cpu else 20, help="timed runs (--benchmark)")
    parser.add_argument("--num_warmup", type=int, default=1 if cpu else 5, help="untimed runs first (--benchmark)")
    args = add_common_args(parser).parse_args()
    args.dtype = DTYPES[args.datatype]
    return args


def launch_options(args) -> dict:
    """The original's launch keywords, AMD's included (dropped with a warning where they mean nothing)."""
    return dict(num_stages=args.num_stages, num_warps=args.num_warps, waves_per_eu=args.waves_per_eu,
                matrix_instr_nonkdim=args.mfmaInstrSize, kpack=args.kpack)


def programs(ctx, args, tiles: int) -> int:
    """The persistent grid: --gemm_sms, or every SM (2 programs on the CPU backend), never more than the tiles."""
    sms = args.gemm_sms or (2 if on_cpu() else ctx.get_cu_count())
    return max(1, min(sms, tiles))


def inputs(ctx, args):
    """A (M, K) and B (K, N), the same on every rank (one seed), scaled so C's entries are about 1."""
    g = torch.Generator(device=ctx.get_device()).manual_seed(123)
    a = torch.randn(args.m, args.k, generator=g, device=ctx.get_device()) / args.k ** 0.5
    b = torch.randn(args.k, args.n, generator=g, device=ctx.get_device())
    return a.to(args.dtype), b.to(args.dtype)


def validate(ctx, what: str, c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> bool:
    """C against the float64 product of A and B: relative error (Frobenius) within the dtype's tolerance."""
    want = a.double() @ b.double()
    error = ((c.double() - want).norm() / want.norm()).item()
    ok = error < TOLERANCE[a.dtype] and not c.isnan().any().item()
    (ctx.log if ok else ctx.error)(f"{what}: C {tuple(c.shape)}, relative error {error:.2e} against torch "
                                   f"(float64): {'passed' if ok else 'FAILED'}")
    return ok


def report(ctx, args, what: str, ms: float) -> None:
    """Rank 0 logs the time and TFLOP/s of the whole (M, N, K) product."""
    if ctx.get_rank() == 0:
        tflops = 2 * args.m * args.n * args.k * 1e-12 / (ms * 1e-3)
        note = " (the CPU backend: Triton's interpreter)" if on_cpu() else ""
        ctx.log_stats(f"{what} (M={args.m} N={args.n} K={args.k}, {args.datatype}, {ctx.get_num_ranks()} ranks): "
                      f"{ms:.3f} ms, {tflops:.3f} TFLOP/s{note}")
