"""Probe: how fast do two GPUs move data across NVLink both ways at once, by SM loads and by SM stores?

    iris run -n 2 benchmarks/probes/bidirectional_probe.py          (2 NVIDIA GPUs, one rank per GPU)
    iris run -n 2 benchmarks/probes/bidirectional_probe.py --sizes 64M 128M

A two-rank reduce_scatter of 2 x S bytes per rank reads S bytes from the peer while the peer reads S bytes from
it; its floor is the link's rate both ways at once, not one way's (what ``benchmarks/rma.py`` measures). For each
size S, each row moves S bytes per direction: ``load`` (iris.load from the peer, stored locally) and ``store``
(iris.store into the peer), each one way (rank 0 alone) and both ways (both ranks at once), and ``reduce_scatter``
of 2 x S per rank (both ways by construction). Every sample starts after ``ctx.device_barrier`` (the ranks start
together); each rank prints its median microseconds per call and GB/s per direction. The data moved is checked
once per op. (Copy-engine rows, ``dst.copy_(src)`` into a tensor on the peer's device after the same barrier,
were tried and dropped: they gave 185-1089 us for the same copy.)
"""
import argparse
import os
import sys
from pathlib import Path

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(k, v)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results, rma
import torch  # noqa: E402

import iris  # noqa: E402
from _results import interleaved_median_us, parse_size  # noqa: E402
from rma import kernel_launch  # noqa: E402

BLOCK, WARPS = 4096, 8  # one of rma.py's tuned (BLOCK, num_warps) pairs


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=[128 << 20], help="bytes per direction")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("bidirectional_probe: needs 2 NVIDIA GPUs (one rank each)")
        return 1
    ctx = iris.iris(5 * sum(args.sizes) + (64 << 20))  # src, dst, scattered and x (twice the size): 5 x each size
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    if world != 2:
        ctx.error("bidirectional_probe: run it with 2 ranks: iris run -n 2 benchmarks/probes/bidirectional_probe.py")
        ctx.close()
        return 2
    peer = 1 - rank
    heap_bases = ctx.get_heap_bases()
    for nbytes in args.sizes:
        n = nbytes // 2
        src = ctx.full((n,), rank + 1, dtype=torch.bfloat16)
        dst = ctx.zeros(n, dtype=torch.bfloat16)
        x = ctx.full((2 * n,), rank + 1, dtype=torch.bfloat16)
        scattered = ctx.empty(n, dtype=torch.bfloat16)
        ops = {"load": kernel_launch("load", src, dst, n, rank, peer, heap_bases, BLOCK, WARPS),
               "store": kernel_launch("store", src, dst, n, rank, peer, heap_bases, BLOCK, WARPS)}
        calls = {}
        for name, op in ops.items():
            calls[f"{name} one way"] = op if rank == 0 else (lambda: None)
            calls[f"{name} both ways"] = op
        calls["reduce_scatter"] = lambda: ctx.ccl.reduce_scatter(scattered, x)
        for name, call in calls.items():  # check once what each moved
            dst.zero_()
            ctx.device_barrier()
            call()
            ctx.device_barrier()
            torch.cuda.synchronize()
            moved = scattered if name == "reduce_scatter" else dst
            expected = 3 if name == "reduce_scatter" else peer + 1
            receiver = 0 if name.startswith("load") else 1  # of a one-way row: the rank whose dst changed
            acted = name == "reduce_scatter" or name.endswith("both ways") or rank == receiver
            if acted and not bool((moved.float() == expected).all()):
                ctx.error(f"bidirectional_probe: {name} at {nbytes} bytes did not move the data (rank {rank})")
                return 1
        us = interleaved_median_us(calls, args.warmup, args.iters, True, before_each=ctx.device_barrier,
                                   agree=lambda batch: ctx.broadcast(batch, src=0))
        for name, t in us.items():
            print(f"{nbytes >> 20:5d} MiB per direction  {name:22s} {t:9.2f} us  {nbytes / t / 1e3:7.1f} GB/s "
                  "per direction", flush=True)
        ctx.barrier()
    ctx.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
