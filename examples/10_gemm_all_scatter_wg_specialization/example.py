"""Workgroup-specialized GEMM + all-scatter: one kernel whose programs either compute tiles or scatter them.

Programs below ``gemm`` compute tiles, store each locally and raise its flag (release); the last
``--comm-programs`` programs wait for each flag (acquire) and store the tile into every rank's C.
One launch, no second stream; the communication programs are the highest ids, so they are
dispatched after the compute programs (and, on the CPU backend, run after them). See examples/common/all_scatter.py.

    iris run -n 2 examples/10_gemm_all_scatter_wg_specialization/example.py --validate --benchmark
"""

import sys
from pathlib import Path

import triton
import triton.language as tl

import iris
from iris.runtime import interpreted

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import all_scatter as common  # noqa: E402


@triton.jit
def gemm_all_scatter(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, local, flags, call, c, stride_cm,
                     stride_cn, rank, world, heap_bases, gemm, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    if pid < gemm:  # a compute program
        for tile in range(pid, tiles, gemm):
            acc, rows, cols = common.compute_tile(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile,
                                                  UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
            tl.store(local + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(local.dtype.element_ty),
                     mask=(rows[:, None] < M) & (cols[None, :] < N))
            tl.debug_barrier()  # every thread's stores of the tile before its flag
            tl.atomic_xchg(flags + tile, call, sem="release", scope="gpu")
    else:  # a communication program
        for tile in range(pid - gemm, tiles, tl.num_programs(0) - gemm):
            iris.wait_until(flags + tile, "==", call, scope="gpu")
            tl.debug_barrier()  # the acquire before any thread reads the tile
            value, rows, cols = common.local_tile(local, tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            common.scatter_tile(c, value, rows, cols, M, N, stride_cm, stride_cn, rank, world, heap_bases)


def workgroup_specialization(p, args) -> None:
    gemm, comm = p.next_call(args.comm_programs)
    gemm_all_scatter[(gemm + comm,)](*p.gemm_args(), p.local, p.flags, p.calls, p.C, p.C.stride(0), p.C.stride(1),
                                     p.rank, p.world, p.ctx.get_heap_bases(), gemm, UPCAST=interpreted(),
                                     **common.TILE, **common.LAUNCH)
    p.ctx.device_barrier()  # every rank's tiles have landed in every C


if __name__ == "__main__":
    sys.exit(common.run(__doc__, workgroup_specialization))
