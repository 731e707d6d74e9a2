"""iris.ops.matmul against cuBLAS (torch.matmul) on one GPU, side by side in one run.

    python benchmarks/gemm.py --validate                 (one GPU; --quick: four M, two (N, K))
    python benchmarks/gemm.py --m 16 --nk 8192x8192       (one shape)

Three implementations per shape, on the same bf16 operands (A: M x K, B: K x N, row-major), timed by
benchmarks/_timing.py's ``device`` (CUDA events around 20 back-to-back calls) and ``graph`` (the 20 calls replayed
from a CUDA graph: the kernels alone, without the host's launch path):

    cublas      torch.matmul(A, B, out=...)
    iris        iris.ops.matmul, the persistent kernel (IRIS_GEMM_TUNED=0, the default)
    iris_tuned  iris.ops.matmul with IRIS_GEMM_TUNED=1 (K split in parts at M <= 128, TMA loads on NVIDIA)

Each row: the shape, the implementation, the method, microseconds per call, TFLOP/s, and the ratio of cuBLAS's time
to this one's (above 1: faster than cuBLAS). ``--validate`` checks each output against cuBLAS's first. On the CPU
backend (no GPU) it runs the eager method on a small shape: a smoke test, not a figure.
"""

import argparse
import itertools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: _results, _timing

import torch
from _results import add_csv_argument, check_csv_argument, default_csv, write_csv
from _timing import Timer

import iris
from iris.ops import matmul
from iris.ops.gemm import chosen_tile

SIZES = (4096, 8192, 14336)
ROWS = (1, 16, 32, 64, 128, 1024, 4096, 8192)
QUICK_ROWS, QUICK_NK = (16, 128, 1024, 4096), ((8192, 8192), (14336, 8192))


def nk_pair(text: str) -> tuple[int, int]:
    try:
        n, k = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write N and K as NxK, e.g. 8192x14336") from None
    return n, k


def implementations(a, b, outs) -> dict:
    """label -> one call; the iris ones set IRIS_GEMM_TUNED for their call (read by matmul at each call)."""

    def iris_call(tuned: str, out):
        def call():
            os.environ["IRIS_GEMM_TUNED"] = tuned
            matmul(a, b, out=out)
        return call

    return {"cublas": lambda: torch.matmul(a, b, out=outs["cublas"]), "iris": iris_call("0", outs["iris"]),
            "iris_tuned": iris_call("1", outs["iris_tuned"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, nargs="+", default=None,
                        help=f"rows of A (default {' '.join(map(str, ROWS))})")
    parser.add_argument("--nk", type=nk_pair, nargs="+", default=None,
                        help="N x K pairs (default: every pair of 4096, 8192, 14336)")
    parser.add_argument("--quick", action="store_true", help="M in 16 128 1024 4096, (N, K) 8192x8192 and 14336x8192")
    parser.add_argument("--samples", type=int, default=20, help="samples per figure (the median is the figure)")
    parser.add_argument("--validate", action="store_true", help="check every output against cuBLAS's")
    add_csv_argument(parser, "gemm")
    args = parser.parse_args()
    check_csv_argument(parser, args, "gemm")
    gpu = torch.cuda.is_available() and iris.runtime.get_backend().compiles_kernels
    device = torch.device("cuda" if gpu else "cpu")
    if not gpu:  # the interpreter: one small shape, a smoke test
        rows, pairs = args.m or [16], args.nk or [(64, 64)]
    else:
        rows = args.m or (QUICK_ROWS if args.quick else ROWS)
        pairs = args.nk or (QUICK_NK if args.quick else list(itertools.product(SIZES, SIZES)))
    dtype = torch.bfloat16 if gpu else torch.float32
    timer = Timer(gpu=gpu, samples=args.samples, warmup=3)
    methods = ("graph", "device") if gpu else ("eager",)
    table, failures = [], 0
    name = torch.cuda.get_device_name(device) if gpu else "cpu"
    for (n, k), m in itertools.product(pairs, rows):
        g = torch.Generator(device=device).manual_seed(m * 7 + n * 3 + k)
        a = torch.randn(m, k, generator=g, device=device).to(dtype)
        b = torch.randn(k, n, generator=g, device=device).to(dtype)
        outs = {label: torch.empty(m, n, dtype=dtype, device=device) for label in ("cublas", "iris", "iris_tuned")}
        impls = implementations(a, b, outs)
        if args.validate:
            for call in impls.values():
                call()
            for label in ("iris", "iris_tuned"):
                error = ((outs[label].float() - outs["cublas"].float()).norm() /
                         outs["cublas"].float().norm().clamp_min(1e-30)).item()
                if error > 2e-2:
                    failures += 1
                    print(f"M={m} N={n} K={k}: {label} differs from cuBLAS (relative error {error:.3g})", flush=True)
        for method in methods:
            figures = timer.per_call_us(impls, method)
            # each iris kernel's last call was of this shape: its autotuner's choice for it
            chosen = {"iris": chosen_tile(False), "iris_tuned": chosen_tile(True)}
            base = figures["cublas"]
            for label, us in figures.items():
                tflops = 2 * m * n * k / us / 1e6 if isinstance(us, float) else ""
                ratio = base / us if isinstance(us, float) and isinstance(base, float) else ""
                table.append({"gpu": name, "dtype": str(dtype).removeprefix("torch."), "M": m, "N": n, "K": k,
                              "impl": label, "method": method, "us": us, "tflops": tflops, "vs_cublas": ratio,
                              "tile": chosen.get(label, "")})
            line = "  ".join(f"{label} {us:8.1f} us ({base / us:4.2f}x)" if isinstance(us, float) else f"{label} {us}"
                             for label, us in figures.items())
            print(f"M={m:5d} N={n:5d} K={k:5d} {method:6s} {line}", flush=True)
        if chosen["iris_tuned"]:
            print(f"M={m:5d} N={n:5d} K={k:5d} tiles: iris {chosen['iris']}; iris_tuned {chosen['iris_tuned']}",
                  flush=True)
    os.environ.pop("IRIS_GEMM_TUNED", None)
    write_csv(table, args.csv or default_csv("gemm", name, 1))
    if failures:
        print(f"{failures} outputs differ from cuBLAS's", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
