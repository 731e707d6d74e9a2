"""Bulk-synchronous GEMM + all-scatter: the whole GEMM, then the whole scatter, then a barrier.

No overlap: the baseline of the taxonomy (see examples/common/all_scatter.py). Every rank computes A @ B_r with
iris.ops.matmul into a local buffer, then a scatter kernel stores each tile into every rank's C.

    iris run -n 2 examples/12_gemm_all_scatter_bulk_synchronous/example.py --validate --benchmark
"""

import sys
from pathlib import Path

import triton
import triton.language as tl

from iris.ops import matmul

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import all_scatter as common  # noqa: E402


@triton.jit
def scatter(local, c, M, N, stride_cm, stride_cn, rank, world, heap_bases, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    value, rows, cols = common.local_tile(local, tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    common.scatter_tile(c, value, rows, cols, M, N, stride_cm, stride_cn, rank, world, heap_bases)


def bulk_synchronous(p, args) -> None:
    matmul(p.A, p.B, out=p.local)  # 1. the GEMM: every tile
    tile = {k: v for k, v in common.TILE.items() if k != "BLOCK_K"}
    scatter[(p.tiles,)](p.local, *p.c_args(), **tile)  # 2. every tile to every rank
    p.ctx.device_barrier()  # 3. every rank's tiles have landed in every C


if __name__ == "__main__":
    sys.exit(common.run(__doc__, bulk_synchronous))
