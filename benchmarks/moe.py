"""MoE dispatch and combine: Iris (counts on the device) beside the PyTorch path (NCCL), in one run.

    iris run -n 2 benchmarks/moe.py [--tokens 128 512 2048 8192] [--hidden 7168] [--experts 256] [--topk 8]
                                    [--iters 20] [--warmup 5] [--validate] [--csv PATH]

DeepSeek-V3-like shapes by default (hidden 7168, 256 experts, top-k 8, bf16), random routing. For each tokens
per rank, three phases, each of both:

    iris          ctx.ccl.moe_dispatcher: dispatch, combine (iris.ccl.moe; nothing waits on the host)
    torch.nccl    the usual PyTorch path: per-rank counts exchanged with all_to_all_single, read on the host
                  (.tolist()), then all_to_all_single with those splits; combine the same way back

and the round trip (dispatch, an identity expert, combine); ``iris.dispatch.fp8`` and ``iris.round_trip.fp8``
dispatch the rows as float8 e4m3 with a scale per row (half the bytes; the experts' bf16 outputs come back). On
GPUs also ``iris.round_trip.graph``: a batch of bf16 round trips captured once in a CUDA graph and replayed
(``_results.graph_median_us``, timed after the others), as an inference engine runs its MoE layers (Iris's path
reads no count on the host, so it can be captured; the PyTorch path cannot: it waits on the host for the
splits). Each figure is the median per call over --iters
samples taken in turns (benchmarks/_results.py); every sample starts after a device barrier. On the CPU backend
it is a smoke test, not a figure. Results: a table and a CSV (benchmarks/results/moe_<gpu>_<W>ranks.csv).
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse

import torch
import torch.distributed as dist
from _results import (add_csv_argument, check_csv_argument, default_csv, graph_median_us, interleaved_median_us,
                      plot_ways, run_facts, write_csv)

import iris


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 2048, 8192] if gpu else [4])
    parser.add_argument("--hidden", type=int, default=7168 if gpu else 32)
    parser.add_argument("--experts", type=int, default=256 if gpu else 8)
    parser.add_argument("--topk", type=int, default=8 if gpu else 2)
    parser.add_argument("--iters", type=int, default=20 if gpu else 2)
    parser.add_argument("--warmup", type=int, default=5 if gpu else 1)
    parser.add_argument("--validate", action="store_true", help="check both round trips give the same output")
    add_csv_argument(parser, "moe")
    args = parser.parse_args()
    check_csv_argument(parser, args, "moe")
    return args


class TorchPath:
    """Dispatch and combine the way PyTorch programs do them: the splits on the host, NCCL's all_to_all_single."""

    def __init__(self, experts: int, topk: int, world: int):
        self.experts, self.topk, self.world = experts, topk, world

    def dispatch(self, x, idx):
        flat = idx.reshape(-1)
        order = torch.argsort(flat, stable=True)
        per_rank = torch.bincount(flat, minlength=self.experts).view(self.world, -1).sum(1)
        arriving = torch.empty_like(per_rank)
        dist.all_to_all_single(arriving, per_rank)
        sent, received = per_rank.tolist(), arriving.tolist()  # the host waits here
        out = x.new_empty(sum(received), x.shape[1])
        dist.all_to_all_single(out, x.index_select(0, order // self.topk), received, sent)
        return out, (order, sent, received)

    def combine(self, rows, state, weights, tokens):
        order, sent, received = state
        back = rows.new_empty(sum(sent), rows.shape[1])
        dist.all_to_all_single(back, rows, sent, received)
        out = torch.zeros(tokens, rows.shape[1], dtype=torch.float32, device=rows.device)
        out.index_add_(0, order // self.topk, back.float() * weights.reshape(-1)[order][:, None])
        return out.to(rows.dtype)


def main() -> int:
    ctx = iris.iris(8 << 30 if torch.cuda.is_available() else 1 << 28)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    gpu = ctx.backend.name != "cpu"
    args = parse_args(gpu)
    base = run_facts(ctx, args.iters, dtype="bf16", hidden=args.hidden, experts=args.experts, topk=args.topk)
    moe = ctx.ccl.moe_dispatcher(hidden_dim=args.hidden, num_experts=args.experts, topk=args.topk,
                                 max_tokens=max(args.tokens))
    # fp8 dispatch: the rows travel as float8 e4m3 with a scale each; the experts' bf16 outputs go back
    moe_fp8 = ctx.ccl.moe_dispatcher(hidden_dim=args.hidden, num_experts=args.experts, topk=args.topk,
                                     max_tokens=max(args.tokens), dispatch_dtype=torch.float8_e4m3fn)
    expert_out = torch.zeros(moe_fp8.world * max(args.tokens) * args.topk, args.hidden, dtype=torch.bfloat16,
                             device=device)  # what an expert would write from the fp8 rows
    torch_path = TorchPath(args.experts, args.topk, world)
    rows, failed = [], False
    for tokens in args.tokens:
        g = torch.Generator().manual_seed(rank * 7 + tokens)
        x = torch.randn(tokens, args.hidden, generator=g).to(torch.bfloat16).to(device)
        idx = torch.stack([torch.randperm(args.experts, generator=g)[:args.topk] for _ in range(tokens)]).to(device)
        weights = torch.rand(tokens, args.topk, generator=g).to(device)
        held = {}

        def iris_dispatch():
            held["iris"] = moe.dispatch(x, idx, weights)

        def iris_combine():
            recv, _, handle = held["iris"]
            held["iris_out"] = moe.combine(recv, handle)

        def iris_dispatch_fp8():
            held["iris_fp8"] = moe_fp8.dispatch(x, idx, weights)

        def iris_round_trip_fp8():
            iris_dispatch_fp8()
            moe_fp8.combine(expert_out, held["iris_fp8"][2])

        def torch_dispatch():
            held["torch"] = torch_path.dispatch(x, idx)

        def torch_combine():
            out, state = held["torch"]
            held["torch_out"] = torch_path.combine(out, state, weights, tokens)

        iris_dispatch(), iris_combine(), torch_dispatch(), torch_combine()
        if args.validate:
            error = ((held["iris_out"].float() - held["torch_out"].float()).norm()
                     / held["torch_out"].float().norm().clamp_min(1e-9)).item()
            if error > 1e-2:
                failed = True
                print(f"[rank {rank}] VALIDATION FAILED at {tokens} tokens: the round trips differ by {error:.3g}")
        calls = {"iris.dispatch": iris_dispatch, "torch.nccl.dispatch": torch_dispatch,
                 "iris.combine": iris_combine, "torch.nccl.combine": torch_combine,
                 "iris.round_trip": lambda: (iris_dispatch(), iris_combine()),
                 "torch.nccl.round_trip": lambda: (torch_dispatch(), torch_combine()),
                 "iris.dispatch.fp8": iris_dispatch_fp8, "iris.round_trip.fp8": iris_round_trip_fp8}
        times = interleaved_median_us(calls, args.warmup, args.iters, gpu, before_each=ctx.device_barrier,
                                      agree=lambda b: ctx.broadcast(b, src=0))
        if gpu:  # a batch of round trips captured once and replayed (_results.graph_median_us)
            times["iris.round_trip.graph"] = graph_median_us(lambda: (iris_dispatch(), iris_combine()), args.warmup,
                                                             args.iters, agree=lambda b: ctx.broadcast(b, src=0),
                                                             before_each=ctx.device_barrier)
        times = ctx.broadcast(times, src=0)
        for impl, us in times.items():
            rows.append({**base, "tokens": tokens, "impl": impl, "us": us})
        if rank == 0:
            line = "  ".join(f"{impl} {us:10.1f} us" for impl, us in times.items())
            print(f"tokens {tokens:5}  {line}", flush=True)
    ctx.barrier()
    if rank == 0:
        if not gpu:
            print("note: CPU backend (Triton's interpreter): a smoke test, not a figure")
        path = args.csv or default_csv("moe", base["gpu"], world)
        write_csv(rows, path)
        plot_ways(rows, ("hidden",), "tokens", path.with_suffix(".png"), f"MoE dispatch and combine, {world} ranks")
    ctx.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
