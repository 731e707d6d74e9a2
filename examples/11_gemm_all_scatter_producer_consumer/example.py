"""Producer-consumer GEMM + all-scatter: a GEMM kernel and a scatter kernel on two streams, at once.

The GEMM kernel (most SMs) stores each finished tile locally and raises the tile's flag (release);
the scatter kernel (``--comm-programs`` SMs, another stream) waits for each flag (acquire) and
stores the tile into every rank's C while the GEMM goes on. Flags hold the call number, so they
need no reset between calls. See examples/common/all_scatter.py for the taxonomy.

    iris run -n 2 examples/11_gemm_all_scatter_producer_consumer/example.py --validate --benchmark
"""

import contextlib
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import iris
from iris.runtime import interpreted

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import all_scatter as common  # noqa: E402


@triton.jit
def produce(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, local, flags, call, UPCAST: tl.constexpr,
            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    for tile in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
        acc, rows, cols = common.compute_tile(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile, UPCAST,
                                              BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M)
        tl.store(local + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(local.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))
        tl.debug_barrier()  # every thread's stores of the tile before its flag
        tl.atomic_xchg(flags + tile, call, sem="release", scope="gpu")


@triton.jit
def consume(local, flags, call, c, M, N, stride_cm, stride_cn, rank, world, heap_bases, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    for tile in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
        iris.wait_until(flags + tile, "==", call, scope="gpu")
        tl.debug_barrier()  # the acquire before any thread reads the tile
        value, rows, cols = common.local_tile(local, tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        common.scatter_tile(c, value, rows, cols, M, N, stride_cm, stride_cn, rank, world, heap_bases)


_side = {}


def producer_consumer(p, args) -> None:
    gemm, comm = p.next_call(args.comm_programs)
    tile = {k: v for k, v in common.TILE.items() if k != "BLOCK_K"}
    side = None if interpreted() else _side.setdefault("stream", torch.cuda.Stream())
    if side is not None:  # what came before on this stream (C, the flags) is ready for the consumer too;
        side.wait_stream(torch.cuda.current_stream())  # waiting after the producer's launch would serialize
    # On the CPU backend a launch runs to its end before returning: the producer must go first.
    produce[(gemm,)](*p.gemm_args(), p.local, p.flags, p.calls, UPCAST=interpreted(), **common.TILE, **common.LAUNCH)
    with contextlib.nullcontext() if side is None else torch.cuda.stream(side):
        consume[(comm,)](p.local, p.flags, p.calls, *p.c_args(), **tile)
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    p.ctx.device_barrier()  # every rank's tiles have landed in every C


if __name__ == "__main__":
    sys.exit(common.run(__doc__, producer_consumer))
