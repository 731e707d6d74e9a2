"""Probe: all_reduce's one_shot and two_shot (and reduce_scatter) by ``Config.block_size``, beside torch symm_mem.

    iris run -n 2 benchmarks/probes/all_reduce_block_probe.py        (NVIDIA GPUs, one rank per GPU)
    iris run -n 2 benchmarks/probes/all_reduce_block_probe.py --sizes 256M --blocks 1024 2048 4096 8192 \
        --variants two_shot --reduce-scatter

At each size of bf16 per rank (default 64 KiB-1 MiB), each call (every variant/block pair, the default, torch
symmetric memory's one_shot and two_shot; with ``--reduce-scatter`` also reduce_scatter by block, whose input is
that size) is timed three times in turns: replayed from a CUDA graph (the GPU's time per call,
``_results.graph_median_us``) and eager (``_results.median_us``). The output is checked once per size. Rank 0
prints microseconds per call, the three rounds side by side.
Result on 2 x H100: benchmarks/probes/README.md (the output in git history).
"""
import argparse
import os
import sys
from pathlib import Path

for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(k, v)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results, ccl
import torch  # noqa: E402

import iris  # noqa: E402
from _results import graph_median_us, median_us, parse_size  # noqa: E402
from ccl import symm_mem_calls  # noqa: E402
from iris.ccl import Config  # noqa: E402

ROUNDS = 3


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=parse_size, default=[64 << 10, 128 << 10, 256 << 10, 512 << 10,
                                                                         1 << 20], help="bytes per rank (64K ...)")
    parser.add_argument("--blocks", nargs="+", type=int, default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--variants", nargs="+", choices=("two_shot", "one_shot"), default=["two_shot", "one_shot"])
    parser.add_argument("--reduce-scatter", action="store_true", help="also reduce_scatter by block")
    parser.add_argument("--fused-bytes", type=parse_size, default=None,
                        help="Config.fused_bytes of the variant/block calls (default: Config's)")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    if not torch.cuda.is_available():
        print("all_reduce_block_probe: needs NVIDIA GPUs (CUDA graphs, torch symmetric memory)")
        return 1
    ctx = iris.iris(max(1 << 30, 4 * max(args.sizes) + (64 << 20)))
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    agree = lambda batch: ctx.broadcast(batch, src=0)  # noqa: E731
    for nbytes in args.sizes:
        numel = nbytes // 2
        x = ctx.ones(numel, dtype=torch.bfloat16)
        y = ctx.empty(numel, dtype=torch.bfloat16)
        scattered = ctx.empty(numel // world, dtype=torch.bfloat16)
        calls = {}
        for variant in args.variants:
            for block in args.blocks:
                fused = {} if args.fused_bytes is None else {"fused_bytes": args.fused_bytes}
                config = Config(all_reduce_variant=variant, block_size=block, **fused)
                calls[f"{variant}/{block}"] = lambda config=config: ctx.ccl.all_reduce(y, x, config=config)
        calls["iris"] = lambda: ctx.ccl.all_reduce(y, x)
        if args.reduce_scatter:
            for block in args.blocks:
                config = Config(block_size=block)
                calls[f"reduce_scatter/{block}"] = lambda config=config: ctx.ccl.reduce_scatter(scattered, x,
                                                                                                 config=config)
            calls["reduce_scatter"] = lambda: ctx.ccl.reduce_scatter(scattered, x)
        calls.update(symm_mem_calls(numel, torch.bfloat16, x.device, max(args.sizes))[0])
        graph = {label: [] for label in calls}
        eager = {label: [] for label in calls}
        for _ in range(ROUNDS):
            for label, call in calls.items():
                ctx.barrier()
                graph[label].append(ctx.broadcast(graph_median_us(call, 5, 20, 200.0, agree=agree), src=0))
                ctx.barrier()
                eager[label].append(ctx.broadcast(median_us(call, 5, 20, True, 200.0, agree=agree), src=0))
        if not torch.all(y.float() == world) or (args.reduce_scatter and not torch.all(scattered.float() == world)):
            raise SystemExit(f"rank {rank}: all_reduce or reduce_scatter of ones did not give {world} everywhere at "
                             f"{nbytes} bytes")
        if rank == 0:
            for label in calls:
                print(f"{nbytes >> 10:7d}K {label:22s} graph {' '.join(f'{v:6.2f}' for v in graph[label])} | eager "
                      f"{' '.join(f'{v:6.2f}' for v in eager[label])}", flush=True)
    ctx.barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
