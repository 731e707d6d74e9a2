"""One-way flag latency between every pair of ranks, and the time of one device_barrier.

    iris run -n 2 benchmarks/latency.py [--iters 2000] [--replays 20] [--csv PATH]

flag ping-pong  ranks a < b: a signals b's flag, b waits for it and signals a's flag, a waits;
                ``--iters`` round trips in one kernel launch. One-way latency = time / (2 iters).
device_barrier  ``--iters`` device_barrier() calls back to back; time per call.
symm_mem        torch symmetric memory's barrier (``handle.barrier()``), the same count, in the
                same run where torch has it (NVIDIA); otherwise the row says why not.

On GPUs each measurement is one CUDA graph (captured once, then replayed ``--replays`` times,
timed with CUDA events; the median replay is reported), so launch overhead is not counted.
The kernels keep their counters in device memory, so every replay is a new round. On the CPU
backend (Triton's interpreter) the same runs with a wall clock and small defaults: a smoke test,
not a figure. Results: a table and a CSV under benchmarks/results/.
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse
import statistics
import time

import torch
from _results import add_csv_argument, check_csv_argument, default_csv, run_facts, write_csv

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl


@triton.jit
def ping_pong_kernel(flags, rounds, cur, a, b, iters, heap_bases):
    # flags[p] on rank r: the last round partner p signalled to r; rounds[p]: rounds r played with p.
    # Both live in memory, so a replayed graph counts on from where the last replay stopped.
    partner = a + b - cur
    start = tl.load(rounds + partner)
    for k in range(1, iters + 1):
        if cur == a:
            iris.signal(flags + cur, start + k, cur, partner, heap_bases)
            iris.wait_until(flags + partner, ">=", start + k)
        else:
            iris.wait_until(flags + partner, ">=", start + k)
            iris.signal(flags + cur, start + k, cur, partner, heap_bases)
    tl.store(rounds + partner, start + iters)


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=2000 if gpu else 20, help="round trips or barriers per replay")
    parser.add_argument("--replays", type=int, default=20 if gpu else 3, help="timed replays (median reported)")
    add_csv_argument(parser, "latency")
    args = parser.parse_args()
    check_csv_argument(parser, args, "latency")
    for name in ("iters", "replays"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


class Timer:
    """Runs ``work`` as a CUDA graph replay (GPU) or directly (CPU) and returns the median seconds."""

    def __init__(self, gpu: bool, replays: int):
        self.gpu, self.replays = gpu, replays

    def median_s(self, ctx, work) -> float:
        if not self.gpu:
            samples = []
            for _ in range(self.replays):
                ctx.barrier()
                started = time.perf_counter()
                work()
                samples.append(time.perf_counter() - started)
            return statistics.median(samples)
        stream = torch.cuda.Stream()
        ctx.barrier()
        with torch.cuda.stream(stream):
            work()  # warm-up outside capture: compiles the kernels
        stream.synchronize()
        ctx.barrier()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            work()
        samples = []
        for _ in range(self.replays):
            ctx.barrier()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end) / 1e3)
        return statistics.median(samples)


def symm_mem_barrier(ctx, iters: int):
    """A callable doing ``iters`` torch symmetric-memory barriers, or the reason there is none."""
    if not torch.cuda.is_available() or ctx.backend.name != "cuda":
        return None, "needs CUDA"
    try:
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        buffer = symm_mem.empty(16, dtype=torch.int32, device=ctx.get_device())
        handle = symm_mem.rendezvous(buffer, dist.group.WORLD.group_name)
    except Exception as exc:  # an unavailable comparison is reported, never silently dropped
        return None, f"unavailable: {type(exc).__name__}: {exc}"

    def run():
        for _ in range(iters):
            handle.barrier(channel=0)

    return run, ""


def main() -> int:
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    gpu = ctx.backend.name != "cpu"
    args = parse_args(gpu)
    if world < 2:
        raise SystemExit("run with at least two ranks: iris run -n 2 benchmarks/latency.py")
    timer = Timer(gpu, args.replays)
    device = ctx.get_device()
    flags = ctx.zeros(world, dtype=torch.int64)
    rounds = torch.zeros(world, dtype=torch.int64, device=device)
    rows = []
    base = run_facts(ctx, args.iters)

    for a in range(world):
        for b in range(a + 1, world):
            def ping_pong(a=a, b=b):
                if rank in (a, b):
                    ping_pong_kernel[(1,)](flags, rounds, rank, a, b, args.iters, ctx.get_heap_bases())

            seconds = timer.median_s(ctx, ping_pong)
            seconds = ctx.broadcast(seconds, src=a)
            rows.append({**base, "measure": "one_way_flag", "impl": "iris", "pair": f"{a}-{b}",
                         "us": seconds / (2 * args.iters) * 1e6, "note": ""})

    def barriers():
        for _ in range(args.iters):
            ctx.device_barrier()

    seconds = ctx.broadcast(timer.median_s(ctx, barriers), src=0)
    rows.append({**base, "measure": "barrier", "impl": "iris.device_barrier", "pair": "all",
                 "us": seconds / args.iters * 1e6, "note": ""})
    run, why = symm_mem_barrier(ctx, args.iters)
    if run is not None:
        seconds = ctx.broadcast(timer.median_s(ctx, run), src=0)
        rows.append({**base, "measure": "barrier", "impl": "torch_symm_mem", "pair": "all",
                     "us": seconds / args.iters * 1e6, "note": ""})
    else:
        rows.append({**base, "measure": "barrier", "impl": "torch_symm_mem", "pair": "all", "us": "", "note": why})
    ctx.barrier()
    if rank == 0:
        print(f"{'measure':14} {'impl':22} {'pair':6} {'us':>10}  note")
        for row in rows:
            us = f"{row['us']:10.3f}" if row["us"] != "" else f"{'-':>10}"
            print(f"{row['measure']:14} {row['impl']:22} {row['pair']:6} {us}  {row['note']}")
        if not gpu:
            print("note: CPU backend (Triton's interpreter): a smoke test, not a latency figure")
        write_csv(rows, args.csv or default_csv("latency", base["gpu"], world))
    ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
