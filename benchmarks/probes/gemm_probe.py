"""Probe: how close can the fused ops' Triton tile loop get to cuBLAS on one Hopper GPU?

    python benchmarks/probes/gemm_probe.py [--m 1024 4096] [--n 8192] [--k 8192]       (one NVIDIA GPU)

The fused ops reach 0.85-0.91 of cuBLAS at one rank, with no communication at all
(docs/benchmarks.md, "Where the overlap goes"). This times, in one run and on the same bf16
operands, M x N x K products written in five ways, each a persistent kernel over output tiles
in grouped order as iris.ops.gemm's:

    masked      iris.ops.gemm.tile_product as the fused ops call it (masked pointer loads)
    unmasked    the same loop without masks (the problem divides into tiles)
    tma         A and B tiles loaded through TMA tensor descriptors (tl.make_tensor_descriptor)
    flat        tma, with the loop over tiles flattened into the loop over K
                (``tl.range(..., flatten=True)``): the software pipeline runs on across tiles, so
                the next tile's first loads are in flight while this tile's result is stored
    flat+store  flat, with the result stored through a TMA descriptor in two halves of BLOCK_N / 2
                columns (less shared memory for the epilogue)

beside torch.matmul (cuBLAS) and iris.ops.matmul (autotuned), over a few tile shapes and
pipeline depths. Each figure is benchmarks/_results.median_us's (median of --iters samples); each
ratio is to cuBLAS timed right after the variant (a GPU kept busy for a minute clocks lower).
"""

import argparse
import itertools
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results, ccl

import torch
import triton
import triton.language as tl
from _results import median_us

from iris.ops.gemm import accumulate_described, matmul, tile_of, tile_product

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): the fused ops' default first
TILES = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 64, 8, 4),
         (256, 128, 64, 8, 3), (128, 256, 64, 8, 2), (128, 128, 64, 8, 3), (128, 128, 128, 8, 3)]
MODES = ("masked", "unmasked", "tma", "flat", "flat+store")


@triton.jit
def _product(a, b, out, M, N, K, MODE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, STAGES: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    if MODE >= 2:
        a_desc = tl.make_tensor_descriptor(a, shape=[M, K], strides=[K, 1], block_shape=[BLOCK_M, BLOCK_K])
        b_desc = tl.make_tensor_descriptor(b, shape=[K, N], strides=[N, 1], block_shape=[BLOCK_K, BLOCK_N])
    if MODE == 4:
        c_desc = tl.make_tensor_descriptor(out, shape=[M, N], strides=[N, 1], block_shape=[BLOCK_M, BLOCK_N // 2])
    for tile in tl.range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0), flatten=MODE >= 3):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        if MODE == 0:
            acc, rows, cols = tile_product(a, b, M, N, K, K, 1, N, 1, tile_m, tile_n, False, BLOCK_M, BLOCK_N,
                                           BLOCK_K)
        elif MODE == 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            ks = tl.arange(0, BLOCK_K)
            for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
                x = tl.load(a + rows[:, None].to(tl.int64) * K + (k + ks)[None, :])
                y = tl.load(b + (k + ks)[:, None].to(tl.int64) * N + cols[None, :])
                acc = tl.dot(x, y, acc)
        elif MODE == 2:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k in tl.range(0, K, BLOCK_K, num_stages=STAGES):
                acc = tl.dot(a_desc.load([tile_m * BLOCK_M, k]), b_desc.load([k, tile_n * BLOCK_N]), acc)
        else:  # flattened: the fused ops' own descriptor loop; the pipeline depth is the kernel's num_stages
            acc = accumulate_described(tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32), a_desc, b_desc, K,
                                       tile_m * BLOCK_M, tile_n * BLOCK_N, False, BLOCK_K, 0)
        if MODE == 4:
            halves = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1)))
            c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N], halves[0].to(out.dtype.element_ty))
            c_desc.store([tile_m * BLOCK_M, tile_n * BLOCK_N + BLOCK_N // 2], halves[1].to(out.dtype.element_ty))
        else:
            tl.store(out + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(out.dtype.element_ty))


def parse_tile(text: str) -> tuple[int, int, int, int, int]:
    """'128x256x64w8s3' -> (128, 256, 64, 8, 3): BLOCK_M x BLOCK_N x BLOCK_K, warps, stages."""
    match = re.fullmatch(r"(\d+)x(\d+)x(\d+)w(\d+)s(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"tile {text!r}: write it as MxNxKwWARPSsSTAGES, e.g. 128x256x64w8s3")
    return tuple(int(g) for g in match.groups())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", nargs="+", type=int, default=[1024, 4096])
    parser.add_argument("--n", nargs="+", type=int, default=[8192])
    parser.add_argument("--k", nargs="+", type=int, default=[8192])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tiles", nargs="+", type=parse_tile, default=TILES,
                        help="tile shapes as MxNxKwWARPSsSTAGES, e.g. 128x128x64w4s4 (default: a set of eight)")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=MODES)
    parser.add_argument("--group-m", nargs="+", type=int, default=[8],
                        help="tile rows per group of the grouped order (default 8, as iris.ops)")
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
                def cublas_call():
                    torch.matmul(a, b)
                cublas = median_us(cublas_call, 3, args.iters, True)
                print(f"{M} x {N} x {K}: cublas {cublas:.1f}, iris.ops.matmul "
                      f"{median_us(lambda: matmul(a, b), 3, args.iters, True):.1f}")
                out = torch.empty_like(ref)
                for (bm, bn, bk, warps, stages), group_m, name in itertools.product(args.tiles, args.group_m,
                                                                                    args.modes):
                    if M % bm or N % bn or K % bk:
                        continue
                    grid = (min(sms, triton.cdiv(M, bm) * triton.cdiv(N, bn)),)
                    label = f"  {name:10} {bm}x{bn}x{bk} w{warps} s{stages}" + (f" g{group_m}" if group_m != 8 else "")

                    def run():
                        _product[grid](a, b, out, M, N, K, MODE=MODES.index(name), BLOCK_M=bm, BLOCK_N=bn,
                                       BLOCK_K=bk, STAGES=stages, GROUP_M=group_m, num_warps=warps,
                                       num_stages=stages)
                    try:
                        us = median_us(run, 3, args.iters, True)
                        # cuBLAS again right after: a GPU that has run GEMMs for a minute clocks lower
                        # than the fresh one of the first cuBLAS figure, so each ratio takes its neighbour.
                        beside = median_us(cublas_call, 3, args.iters, True)
                        error = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
                        print(f"{label}: {us:8.1f}  {beside / us:5.2f}  (cuBLAS beside it {beside:.1f})"
                              + ("" if error < 1e-2 else f"  WRONG (relative error {error:.2g})"), flush=True)
                    except Exception as exc:  # a shape the compiler refuses: say so, go on
                        print(f"{label}: failed: {str(exc).splitlines()[0][:120]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
