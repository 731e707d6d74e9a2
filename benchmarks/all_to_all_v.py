"""all_to_all_v (device counts) beside NCCL's all_to_all_single with splits, in one run.

    iris run -n 2 benchmarks/all_to_all_v.py [--sizes 1M 4M ... 256M] [--skew 0.5] [--iters 20] [--warmup 5]
                                             [--validate] [--csv PATH]

For every size (bytes each rank sends in all, bf16 rows of 4096 elements), member j gets a share of this rank's
rows that grows with j (``--skew``: 0 splits evenly; 0.5, the default, gives the last member about three times
the first's), the same counts for both:

    iris.device_counts   ctx.ccl.all_to_all_v with the counts in a device tensor (nothing read on the host)
    nccl.splits          torch.distributed.all_to_all_single(out, x, output_split_sizes, input_split_sizes) (NCCL;
                         gloo on the CPU backend), the splits known on the host, as torch's path needs them

Each figure is the median per call over --iters samples taken in turns (benchmarks/_results.py); every sample
starts after a device barrier. On the CPU backend it is a smoke test, not a figure. Results: a table and a CSV
(benchmarks/results/all_to_all_v_<gpu>_<W>ranks.csv).
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse

import torch
import torch.distributed as dist
from _results import (add_csv_argument, check_csv_argument, default_csv, interleaved_median_us, parse_size, run_facts,
                      write_csv)

import iris

WIDTH = 4096  # elements a row (a token's hidden state), bf16


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_size, nargs="+",
                        default=[1 << s for s in range(20, 29, 2)] if gpu else [1 << 16])
    parser.add_argument("--skew", type=float, default=0.5, help="how unevenly the rows are split (0: evenly)")
    parser.add_argument("--iters", type=int, default=20 if gpu else 2)
    parser.add_argument("--warmup", type=int, default=5 if gpu else 1)
    parser.add_argument("--validate", action="store_true", help="check both give the same rows before timing")
    add_csv_argument(parser, "all_to_all_v")
    args = parser.parse_args()
    check_csv_argument(parser, args, "all_to_all_v")
    return args


def splits(rows: int, world: int, skew: float) -> list[int]:
    """``rows`` split over the members, member j's share growing with j by ``skew``; sums to ``rows``."""
    weights = [1 + skew * 4 * j / max(1, world - 1) for j in range(world)]
    counts = [int(rows * w / sum(weights)) for w in weights]
    counts[-1] += rows - sum(counts)
    return counts


def main() -> int:
    ctx = iris.iris(3 << 30)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    gpu = ctx.backend.name != "cpu"
    args = parse_args(gpu)
    base = run_facts(ctx, args.iters, dtype="bf16", skew=args.skew)
    rows_out, failed = [], False
    for size in args.sizes:
        rows = max(world, size // (2 * WIDTH))
        send = [splits(rows, world, args.skew)] * world  # every rank sends alike: member j gets send[i][j] from i
        receive = [send[i][rank] for i in range(world)]
        x = ctx.empty(rows, WIDTH, dtype=torch.bfloat16)
        x.copy_(torch.randn(rows, WIDTH, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16))
        out = torch.empty(sum(receive), WIDTH, dtype=torch.bfloat16, device=device)
        ref = torch.empty_like(out)
        counts = torch.tensor(send[rank], dtype=torch.int64, device=device)

        def iris_call():
            ctx.ccl.all_to_all_v(out, x, counts)

        def nccl_call():
            dist.all_to_all_single(ref, x, receive, send[rank])

        if args.validate:
            ctx.barrier()
            iris_call()
            nccl_call()
            ctx.barrier()
            if not torch.equal(out, ref):
                failed = True
                print(f"[rank {rank}] VALIDATION FAILED at {size} bytes: the rows differ from NCCL's")
        times = interleaved_median_us({"iris.device_counts": iris_call, "nccl.splits": nccl_call}, args.warmup,
                                      args.iters, gpu, before_each=ctx.device_barrier,
                                      agree=lambda b: ctx.broadcast(b, src=0))
        times = ctx.broadcast(times, src=0)
        for impl, us in times.items():
            rows_out.append({**base, "bytes": size, "impl": impl, "us": us})
        if rank == 0:
            line = "  ".join(f"{impl} {us:10.2f} us" for impl, us in times.items())
            print(f"{size:>11} bytes  {line}  iris/nccl {times['nccl.splits'] / times['iris.device_counts']:.2f}x",
                  flush=True)
    ctx.barrier()
    if rank == 0:
        if not gpu:
            print("note: CPU backend (Triton's interpreter): a smoke test, not a figure")
        write_csv(rows_out, args.csv or default_csv("all_to_all_v", base["gpu"], world))
    ctx.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
