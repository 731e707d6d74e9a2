"""Probe: which tiles does iris.ops.matmul's autotuner miss?

    python benchmarks/probes/gemm_tile_probe.py [--samples 10]        (one GPU)

The tuned GEMM (``IRIS_GEMM_TUNED=1``) picks its tile per shape with Triton's autotuner, which times each
candidate as launches with L2 flushed before each. This times candidate tiles of matmul's split kernel
(``iris.ops.gemm._split_gemm_kernel``, TMA loads where the backend has them) one by one, replayed from a CUDA
graph as a model's GEMMs run, each beside cuBLAS (``torch.matmul``) in the same samples
(benchmarks/_timing.py's ``graph`` method), and checks each output against cuBLAS's. A tile that beats the
autotuner's choice (``benchmarks/gemm.py`` prints it) belongs in the tuned lists, or the autotuner's timing
ranks tiles otherwise than steady replay does.

Each line: the tile (BLOCK_M x BLOCK_N x BLOCK_K, warps, stages, K parts), microseconds per call, cuBLAS's time
over it, and the relative error against cuBLAS; best first per shape. A tile the compiler refuses (shared memory)
is named with the error.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _timing

import torch
from _timing import Timer

import iris
from iris.ops.gemm import _split_gemm_kernel, split_workspace, tile_count, tma_ready

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT): decode-sized tiles for M <= 128, large ones above
DECODE_TILES = [(128, 64, 64, 4, 4, 1), (128, 64, 128, 4, 4, 1), (128, 64, 128, 8, 4, 1), (128, 64, 64, 4, 6, 1),
                (128, 128, 64, 8, 4, 2), (128, 128, 128, 8, 3, 2), (64, 128, 64, 4, 4, 1), (64, 128, 128, 4, 4, 1),
                (64, 64, 128, 4, 5, 1), (128, 32, 128, 4, 5, 1)]
LARGE_TILES = [(128, 256, 64, 8, 3, 1), (256, 128, 64, 8, 3, 1), (128, 256, 64, 8, 4, 1), (256, 128, 64, 8, 4, 1),
               (128, 128, 64, 4, 5, 1), (128, 128, 128, 8, 3, 1), (128, 256, 64, 4, 3, 1), (256, 128, 64, 4, 3, 1)]
# (M, N, K)
SHAPES = [(128, 8192, 8192), (1024, 8192, 8192), (4096, 8192, 8192), (1024, 14336, 8192), (4096, 14336, 8192)]


def tile_call(a, b, out, tile, tma: bool, programs: int):
    """One launch of the split kernel with ``tile`` on ``a @ b`` into ``out`` (no bias), as matmul makes it."""
    bm, bn, bk, warps, stages, split = tile
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, SPLIT=split)
    (m, k), n = a.shape, b.shape[1]
    parts, ready = split_workspace(a.device, m, n, [meta])
    grid = (min(programs, tile_count(m, n, meta) * split),)

    def call():
        _split_gemm_kernel[grid](a, b, out, out, parts, ready, m, n, k, a.stride(0), a.stride(1), b.stride(0),
                                 b.stride(1), out.stride(0), out.stride(1), HAS_BIAS=False, UPCAST=False, TMA=tma,
                                 num_warps=warps, num_stages=stages, **meta)
    return call


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=10, help="samples per figure (the median is the figure)")
    args = parser.parse_args()
    backend = iris.runtime.get_backend()
    if not (torch.cuda.is_available() and backend.compiles_kernels):
        print("gemm_tile_probe: needs a GPU (the interpreter has no tiles worth timing)", file=sys.stderr)
        return 2
    timer = Timer(gpu=True, samples=args.samples, warmup=3)
    programs = backend.compute_unit_count(torch.device("cuda"))
    print(f"{torch.cuda.get_device_name()}, {programs} compute units", flush=True)
    for m, n, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = torch.randn(m, k, generator=g, device="cuda").bfloat16()
        b = torch.randn(k, n, generator=g, device="cuda").bfloat16()
        reference = torch.matmul(a, b)
        tma = tma_ready(backend, a.device, a, b)
        impls, outs, refused = {"cublas": lambda: torch.matmul(a, b, out=reference)}, {}, []
        for tile in DECODE_TILES if m <= 128 else LARGE_TILES:
            label = "{}x{}x{} w{} s{} split{}".format(*tile)
            outs[label] = torch.empty_like(reference)
            call = tile_call(a, b, outs[label], tile, tma, programs)
            try:
                call()  # compiles: a tile the compiler refuses is left out, named
            except Exception as exc:  # Triton's OutOfResources and its kin
                refused.append(f"{label}: {type(exc).__name__}")
                continue
            impls[label] = call
        figures = timer.per_call_us(impls, "graph")
        base = figures.pop("cublas")
        print(f"M={m} N={n} K={k}: cublas {base:.1f} us", flush=True)
        for label, us in sorted(figures.items(), key=lambda item: item[1]):
            error = ((outs[label].float() - reference.float()).norm() / reference.float().norm()).item()
            print(f"    {label:28s} {us:8.1f} us  {base / us:4.2f}x  error {error:.1e}", flush=True)
        for line in refused:
            print(f"    {line}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
