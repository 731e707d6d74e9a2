"""Probe: how close can the fused ops' Triton tile loop get to cuBLAS on one Hopper GPU?

    python benchmarks/gemm_probe.py [--m 1024 4096] [--n 8192] [--k 8192]       (one NVIDIA GPU)

The fused ops reach 0.85-0.91 of cuBLAS at one rank, with no communication at all
(docs/benchmarks.md, "Where the overlap goes"). This times, in one run and on the same bf16
operands, M x N x K products written in three ways, each a persistent kernel over output tiles
in grouped order as iris.ops.gemm's:

    masked      iris.ops.gemm.tile_product as the fused ops call it (masked pointer loads)
    unmasked    the same loop without masks (the problem divides into tiles)
    tma         A and B tiles loaded through TMA tensor descriptors (tl.make_tensor_descriptor)

beside torch.matmul (cuBLAS) and iris.ops.matmul (autotuned), over a few tile shapes and
pipeline depths. Each figure is benchmarks/_results.median_us's (median of --iters samples).
"""

import argparse
import sys

import torch
import triton
import triton.language as tl
from _results import median_us

from iris.ops.gemm import matmul, tile_of, tile_product

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): the fused ops' default first
TILES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4),
         (256, 128, 64, 8, 3)]


@triton.jit
def _product(a, b, out, M, N, K, MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, STAGES: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if MODE == 2:
        a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if MODE == 0:
            acc, rows, cols = tile_product(a, b, M, N, K, K, 1, N, 1, tile_m, tile_n, False, BLOCK_M, BLOCK_N,
                                           BLOCK_K)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            ks = tl.arange(0, BLOCK_K)
            for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
                if MODE == 1:
                    x = tl.load(a + rows[:, None].to(tl.int64) * K + (k + ks)[None, :])
                    y = tl.load(b + (k + ks)[:, None].to(tl.int64) * N + cols[None, :])
                else:
                    x = a_desc.load([tile_m * BLOCK_M, k])
                    y = b_desc.load([k, tile_n * BLOCK_N])
                acc = tl.dot(x, y, acc)
        tl.store(out + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(out.dtype.element_ty))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--n", nargs="+", type=int, default=[8192])
    parser.add_argument("--k", nargs="+", type=int, default=[8192])
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gemm_probe: needs an NVIDIA GPU (TMA descriptors, cuBLAS)")
        return 1
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name(0)}, triton {triton.__version__}, {sms} SMs; microseconds, "
          "and cuBLAS's time over each (1: as fast as cuBLAS)")
    for M in args.m:
        for N in args.n:
            for K in args.k:
                a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda") / K ** 0.25
                b = torch.randn(K, N, dtype=torch.bfloat16, device="cuda") / K ** 0.25
                ref = torch.matmul(a, b)
                cublas = median_us(lambda: torch.matmul(a, b), 3, args.iters, True)
                print(f"{M} x {N} x {K}: cublas {cublas:.1f}, iris.ops.matmul "
                      f"{median_us(lambda: matmul(a, b), 3, args.iters, True):.1f}")
                out = torch.empty_like(ref)
                for bm, bn, bk, warps, stages in TILES:
                    if M % bm or N % bn or K % bk:
                        continue
                    grid = (min(sms, triton.cdiv(M, bm) * triton.cdiv(N, bn)),)
                    for mode, name in enumerate(("masked", "unmasked", "tma")):
                        def run():
                            _product[grid](a, b, out, M, N, K, MODE=mode, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                                           STAGES=stages, GROUP_M=8, num_warps=warps, num_stages=stages)
                        try:
                            us = median_us(run, 3, args.iters, True)
                            error = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                            print(f"  {name:9} {bm}x{bn}x{bk} w{warps} s{stages}: {us:8.1f}  {cublas / us:5.2f}"
                                  + ("" if error < 1e-2 else f"  WRONG (relative error {error:.2g})"), flush=True)
                        except Exception as exc:  # a shape the compiler refuses: say so, go on
                            print(f"  {name:9} {bm}x{bn}x{bk} w{warps} s{stages}: failed: "
                                  f"{str(exc).splitlines()[0][:120]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
