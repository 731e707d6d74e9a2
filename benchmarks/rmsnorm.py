"""All-reduce + residual add + RMSNorm, the end of a tensor-parallel transformer block, several ways in one run.

    iris run -n 2 benchmarks/rmsnorm.py [--tokens 1 2 4 ... 512] [--hidden 4096 6144 8192] [--dtype bf16]
                                        [--methods device eager graph] [--calls 20] [--iters 20]
                                        [--warmup 5] [--validate] [--compiled] [--csv PATH]

For every (tokens, hidden), with the same partial, residual and weight:

    iris.fused        ctx.ccl.all_reduce_rmsnorm: one kernel (iris.ccl.fused_ar_rmsnorm)
    iris+torch        ctx.ccl.all_reduce of the partial, then torch's residual add and rms_norm
    nccl+torch        torch.distributed.all_reduce (NCCL; gloo on the CPU backend), then the same torch ops
    iris+compiled     with --compiled (the default on a GPU): ctx.ccl.all_reduce, then the residual add and
                      rms_norm in one torch.compile'd function
    nccl+compiled     with --compiled: torch.distributed.all_reduce, then the same compiled function

Each way is timed by each method of --methods, the same for all (benchmarks/_timing.py: device,
CUDA events around --calls back-to-back calls; eager, host-inclusive wall clock; graph, --calls calls replayed
from a CUDA graph, how an inference engine runs a decode step), the median of --iters samples taken in turns,
each after the GPU is idle and the ranks met; the CSV's method column says which. --validate first checks that
the ways give the same output (the fused kernel's bits may differ from torch's RMSNorm by its rounding). On
the CPU backend it is a smoke test, not a figure. Results: a table and a CSV
(benchmarks/results/rmsnorm_<gpu>_<W>ranks.csv).
"""

import os

# NVLink multicast stays off (CONTRIBUTING.md, "On GPUs"); these must be set before torch is imported.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import argparse

import torch
import torch.distributed as dist
from _results import add_csv_argument, check_csv_argument, default_csv, run_facts, write_csv
from _timing import Timer, add_timing_arguments, by_methods, check_timing_arguments, nccl_facts

import iris

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args(gpu: bool) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
                        if gpu else [1, 3])
    parser.add_argument("--hidden", type=int, nargs="+", default=[4096, 6144, 8192] if gpu else [64])
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    add_timing_arguments(parser, gpu)
    parser.add_argument("--validate", action="store_true", help="check the ways agree before timing")
    parser.add_argument("--compiled", action=argparse.BooleanOptionalAction, default=gpu,
                        help="also the ways whose add and norm are torch.compile'd (default: on a GPU)")
    add_csv_argument(parser, "rmsnorm")
    args = parser.parse_args()
    check_csv_argument(parser, args, "rmsnorm")
    check_timing_arguments(parser, args, gpu)
    if min(args.tokens) < 1 or min(args.hidden) < 1:
        parser.error("--tokens and --hidden must be at least 1")
    return args


def residual_add_rms_norm(residual, reduced, weight, eps):
    """``residual += reduced``; returns ``rms_norm(residual) * weight`` (torch's ops; torch.compile may fuse them)."""
    residual.add_(reduced)
    return torch.nn.functional.rms_norm(residual, (residual.shape[-1],), weight, eps)


class Point:
    """The buffers of one (tokens, hidden) and the three ways to run the step on them."""

    def __init__(self, ctx, tokens: int, hidden: int, dtype: torch.dtype, eps: float = 1e-6):
        device, rank = ctx.get_device(), ctx.get_rank()
        g = torch.Generator().manual_seed(rank)
        self.ctx, self.eps = ctx, eps
        self.partial = ctx.empty(tokens, hidden, dtype=dtype)
        self.partial.copy_(torch.randn(tokens, hidden, generator=g).to(dtype))
        self.plain = self.partial.clone()  # NCCL's input: a copy, all_reduced in place
        shared = torch.Generator().manual_seed(1234)
        self.residual = torch.randn(tokens, hidden, generator=shared).to(dtype).to(device)
        self.start = self.residual.clone()
        self.weight = (1 + 0.1 * torch.randn(hidden, generator=shared)).to(dtype).to(device)
        self.reduced = ctx.empty(tokens, hidden, dtype=dtype)
        self.out = torch.empty(tokens, hidden, dtype=dtype, device=device)

    def fused(self):
        self.ctx.ccl.all_reduce_rmsnorm(self.partial, self.residual, self.weight, eps=self.eps, out=self.out)

    def iris_then_torch(self, add_and_norm=None):
        self.ctx.ccl.all_reduce(self.reduced, self.partial)
        self.out = (add_and_norm or residual_add_rms_norm)(self.residual, self.reduced, self.weight, self.eps)

    def nccl_then_torch(self, add_and_norm=None):
        self.plain.copy_(self.partial)
        dist.all_reduce(self.plain)
        self.out = (add_and_norm or residual_add_rms_norm)(self.residual, self.plain, self.weight, self.eps)

    def ways(self, compiled=None) -> dict:
        """label -> call of each way (the compiled ones with ``compiled``, torch.compile of the add and norm)."""
        ways = {"iris.fused": self.fused, "iris+torch": self.iris_then_torch, "nccl+torch": self.nccl_then_torch}
        if compiled is not None:
            ways["iris+compiled"] = lambda: self.iris_then_torch(compiled)
            ways["nccl+compiled"] = lambda: self.nccl_then_torch(compiled)
        return ways

    def check(self, compiled=None) -> list[str]:
        """One call of each way from the same residual: their outputs' relative differences from the fused one's."""
        outputs, ways = [], self.ways(compiled)
        for fn in ways.values():
            self.residual.copy_(self.start)
            self.ctx.barrier()
            fn()
            self.ctx.barrier()
            outputs.append(self.out.double().clone())
        problems = []
        for name, other in zip(list(ways)[1:], outputs[1:]):
            error = ((other - outputs[0]).norm() / outputs[0].norm().clamp_min(1e-30)).item()
            if error > 2e-2:
                problems.append(f"{name} differs from iris.fused by {error:.3g} (relative)")
        self.residual.copy_(self.start)
        return problems


def main() -> int:
    ctx = iris.iris(1 << 30)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    gpu = ctx.backend.name != "cpu"
    args = parse_args(gpu)
    dtype = DTYPES[args.dtype]
    base = run_facts(ctx, args.iters, **nccl_facts(), calls_per_sample=args.calls, dtype=args.dtype)
    timer = Timer(gpu, calls=args.calls, samples=args.iters, warmup=args.warmup, meet=ctx.barrier)
    nccl_captures = gpu and "nccl" in str(dist.get_backend())
    compiled = torch.compile(residual_add_rms_norm, dynamic=True) if args.compiled else None
    rows, failed = [], False
    for hidden in args.hidden:
        for tokens in args.tokens:
            point = Point(ctx, tokens, hidden, dtype)
            if args.validate:
                problems = point.check(compiled)
                failed |= bool(problems)
                for problem in problems:
                    print(f"[rank {rank}] VALIDATION FAILED: tokens {tokens} hidden {hidden}: {problem}")
            calls = point.ways(compiled)
            figures = by_methods(timer, args.methods, calls, lambda found: ctx.broadcast(found, src=0), nccl_captures)
            for method, times in figures.items():
                for impl, us in times.items():
                    timed = not isinstance(us, str)
                    rows.append({**base, "tokens": tokens, "hidden": hidden, "impl": impl, "method": method,
                                 "us": us if timed else "", "note": "" if timed else us})
                if rank == 0:
                    line = "  ".join(f"{impl} {us:9.2f} us" if not isinstance(us, str) else f"{impl} -"
                                     for impl, us in times.items())
                    print(f"tokens {tokens:4} hidden {hidden:5} {method:6}  {line}", flush=True)
    ctx.barrier()
    if rank == 0:
        if not gpu:
            print("note: CPU backend (Triton's interpreter): a smoke test, not a figure")
        write_csv(rows, args.csv or default_csv("rmsnorm", base["gpu"], world))
    ctx.close()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
