"""Tensor-parallel MLP decode under torch.compile + CUDA graphs: the all-reduce by Iris, NCCL and torch symmetric
memory side by side in one run, and the same step with no all-reduce.

    iris run -n 2 benchmarks/tp_decode.py [--hidden 4096 8192] [--batch 1 2 4 8 16 32 64] [--methods graph]
                                          [--calls 20] [--iters 20] [--validate] [--csv PATH]

The step is examples/18_tp_mlp_decode's (Megatron's column- then row-parallel MLP, bf16, ffn = 4 x hidden):
per hidden size and way, it is compiled once with ``torch.compile(fullgraph=True, dynamic=True)``; per batch, it
is timed by each method of --methods (benchmarks/_timing.py; the CSV's method column), by default ``graph``:
--calls back-to-back steps, each step's output the next one's input, captured in a CUDA graph and replayed, as an
inference engine runs decode; the median microseconds per token over --iters samples.

    iris        torch.ops.iris.all_reduce
    nccl        torch.distributed's functional all_reduce (NCCL)
    symm_mem    torch symmetric memory's one_shot_all_reduce_copy
    local       the step with the all-reduce left out: a way's communication share is its time minus this

--validate checks one step of each way against the whole weights in float32 first. On the CPU backend (no
graphs: compiled calls, timed on the host; gloo for nccl; no symmetric memory) it is a smoke test, not a
figure. Results: a table and a CSV (benchmarks/results/tp_decode_<gpu>_<W>ranks.csv) with its PNG.
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse
import importlib.util
from pathlib import Path

import torch
from _results import add_csv_argument, check_csv_argument, default_csv, plot_ways, run_facts, write_csv
from _timing import Timer, add_timing_arguments, check_timing_arguments, nccl_facts

import iris

WAYS = ("iris", "nccl", "symm_mem", "local")


def example():
    """examples/18_tp_mlp_decode/example.py as a module: the benchmark times the example's own step."""
    path = Path(__file__).resolve().parents[1] / "examples" / "18_tp_mlp_decode" / "example.py"
    spec = importlib.util.spec_from_file_location("tp_mlp_decode", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, nargs="+", default=[4096, 8192] if gpu else [64])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64] if gpu else [1, 4])
    parser.add_argument("--ways", nargs="+", choices=WAYS, default=list(WAYS))
    add_timing_arguments(parser, gpu, methods=("graph",))  # decode steps replay a graph, as engines run them
    parser.add_argument("--validate", action="store_true", help="check one step of each way first")
    add_csv_argument(parser, "tp_decode")
    args = parser.parse_args()
    check_csv_argument(parser, args, "tp_decode")
    check_timing_arguments(parser, args, gpu)
    if min(args.hidden) < 1 or min(args.batch) < 1:
        parser.error("--hidden and --batch must be at least 1")
    return args


def main() -> int:
    ctx = iris.iris(1 << 30)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    gpu = ctx.backend.name != "cpu"
    args = parse_args(gpu)
    tp = example()
    dtype = torch.bfloat16
    base = run_facts(ctx, args.iters, **nccl_facts(), calls_per_sample=args.calls, dtype="bf16")
    timer = Timer(gpu, calls=args.calls, samples=args.iters, warmup=args.warmup, meet=ctx.barrier)
    reduce_ways = tp.all_reduces(ctx, [w for w in args.ways if w != "local"],
                                 max(args.batch) * max(args.hidden) * dtype.itemsize, device)
    ways = {**reduce_ways, **({"local": lambda t: t} if "local" in args.ways else {})}
    rows, failed = [], False
    for hidden in args.hidden:
        weights = tp.Weights(hidden, 4 * hidden, rank, world, dtype, device)
        inputs = {batch: torch.randn(batch, hidden, generator=torch.Generator(device=device).manual_seed(batch),
                                     device=device).to(dtype) for batch in args.batch}
        times = {(batch, method): {} for batch in args.batch for method in args.methods}
        for way, all_reduce in ways.items():
            if isinstance(all_reduce, str):
                continue
            step = tp.compiled(tp.make_step(weights, all_reduce))  # one compilation for every batch
            for batch, x in inputs.items():
                if args.validate and way != "local":
                    want = tp.reference(x, weights)
                    error = ((step(x).float() - want).norm() / want.norm()).item()
                    if error > 3e-2:
                        failed = True
                        print(f"[rank {rank}] VALIDATION FAILED: {way} hidden {hidden} batch {batch}: relative "
                              f"error {error:.1e}")
                state = x.clone()
                token = lambda: state.copy_(step(state))  # noqa: E731  (one token: output fed back)
                for method in args.methods:
                    ctx.barrier()
                    times[batch, method][way] = timer.per_call_us({way: token}, method)[way]
        times = ctx.broadcast(times, source_rank=0)
        for (batch, method), per_way in times.items():
            local = per_way.get("local")
            for way, us in per_way.items():
                timed = not isinstance(us, str)
                comm = us - local if timed and isinstance(local, float) and way != "local" else None
                rows.append({**base, "hidden": hidden, "batch": batch, "impl": way, "method": method,
                             "us": us if timed else "", "comm_us": comm, "note": "" if timed else us})
            if rank == 0:
                print(f"hidden {hidden:5} batch {batch:3} {method:6} " + "  ".join(
                    f"{way} {us:9.2f} us" if not isinstance(us, str) else f"{way} -" for way, us in per_way.items()),
                      flush=True)
    if rank == 0:
        for way, why in reduce_ways.items():
            if isinstance(why, str):
                print(f"{way}: not run: {why}")
        if not gpu:
            print("note: CPU backend (Triton's interpreter): a smoke test, not a figure")
        path = args.csv or default_csv("tp_decode", base["gpu"], world)
        write_csv(rows, path)
        plot_ways(rows, ("hidden",), "batch", path.with_suffix(".png"),
                  f"TP MLP decode step, {world} ranks: us per token")
    ctx.barrier()
    ctx.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
