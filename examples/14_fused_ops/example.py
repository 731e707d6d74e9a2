"""Fused GEMM + communication: the five ``ctx.ops`` calls, each one persistent kernel per rank, checked and timed.

| op                    | each rank passes          | each rank gets                                   |
| matmul_all_reduce     | A (M, K), B (K, N)        | (M, N): the sum over ranks of A_r @ B_r          |
| matmul_reduce_scatter | A (M, K), B (K, N)        | (M, N / W): its columns of that sum              |
| all_gather_matmul     | A (M, K), B (W * K, N)    | (M, N): [A_0 ... A_W-1] @ B                      |
| matmul_all_gather     | A (M, K), B (K, N)        | (W * M, N): every rank's A_r @ B_r, stacked      |
| gemm_all_scatter      | A (M, K), B (K, N)        | (M, W * N): every rank's A_r @ B_r, side by side |

Each rank draws its A and B from a seed of its own, so every rank computes every answer in float64
itself. The two ops whose output the peers write (matmul_all_gather, gemm_all_scatter) get it on the
symmetric heap. ``--benchmark`` times each with ``iris.do_bench`` beside ``torch.matmul`` followed
by the matching torch.distributed collective; ``FusedConfig`` (iris.ops) tunes tiles and strategy.

    iris run -n 2 examples/14_fused_ops/example.py --validate
    python examples/14_fused_ops/example.py --validate --benchmark -r 2 --op matmul_all_reduce
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import iris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402

OPS = ["matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "matmul_all_gather", "gemm_all_scatter"]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}  # of the terms' absolute sum


def parse_args():
    cpu = utils.on_cpu()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", type=int, default=64 if cpu else 8192, help="rows of A (default: 64 on the CPU, 8192)")
    parser.add_argument("-n", type=int, default=64 if cpu else 8192, help="columns of B (64 on the CPU, 8192)")
    parser.add_argument("-k", type=int, default=64 if cpu else 8192, help="columns of A (64 on the CPU, 8192)")
    parser.add_argument("--datatype", default="bf16", choices=["fp16", "bf16"], help="type of A and B (bf16)")
    parser.add_argument("--out_datatype", default="fp32", choices=["fp16", "bf16", "fp32"], help="output type (fp32)")
    parser.add_argument("--op", default="all", choices=["all", *OPS], help="which op to run (all)")
    parser.add_argument("-v", "--validate", action="store_true", help="check against float64; exit non-zero if wrong")
    parser.add_argument("-b", "--benchmark", action="store_true", help="time it beside torch.matmul + collective")
    parser.add_argument("--num_experiments", type=int, default=2 if cpu else 50, help="timed runs (--benchmark)")
    parser.add_argument("--num_warmup", type=int, default=1 if cpu else 10, help="untimed runs first (--benchmark)")
    return utils.add_common_args(parser).parse_args()


def shapes(op, m, n, k, world):
    """One rank's (A, B, output) shapes."""
    return {"matmul_all_reduce": ((m, k), (k, n), (m, n)),
            "matmul_reduce_scatter": ((m, k), (k, n), (m, n // world)),
            "all_gather_matmul": ((m, k), (world * k, n), (m, n)),
            "matmul_all_gather": ((m, k), (k, n), (world * m, n)),
            "gemm_all_scatter": ((m, k), (k, n), (m, world * n))}[op]


def answer(op, shards, rank):
    """Rank ``rank``'s output in float64 from every rank's (A, B)."""
    world = len(shards)
    if op == "all_gather_matmul":
        return torch.cat([a for a, _ in shards], dim=1) @ shards[rank][1]
    products = [a @ b for a, b in shards]
    if op == "matmul_all_reduce":
        return sum(products)
    if op == "matmul_reduce_scatter":
        width = products[0].shape[1] // world
        return sum(products)[:, rank * width:(rank + 1) * width]
    return torch.cat(products, dim=0 if op == "matmul_all_gather" else 1)


def torch_version(op, out, a, b, world):
    """The unfused way: torch.matmul, then the collective of torch.distributed."""
    if op == "all_gather_matmul":
        gathered = torch.empty(world, *a.shape, dtype=a.dtype, device=a.device)
        dist.all_gather(list(gathered.unbind(0)), a)
        return lambda: torch.matmul(torch.cat(list(gathered.unbind(0)), dim=1), b)
    if op == "matmul_all_reduce":
        return lambda: dist.all_reduce(torch.matmul(a, b))
    if op == "matmul_reduce_scatter":
        if dist.get_backend() == "gloo":  # gloo has no reduce_scatter
            return lambda: dist.all_reduce(torch.matmul(a, b))
        part = torch.empty(out.shape, dtype=a.dtype, device=a.device)
        return lambda: dist.reduce_scatter(part, [c.contiguous() for c in torch.matmul(a, b).chunk(world, dim=1)])
    return lambda: dist.all_gather([torch.empty_like(a @ b) for _ in range(world)], torch.matmul(a, b))


def main(args) -> int:
    ctx = iris.iris(1 << 27 if utils.on_cpu() else 1 << 34)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    if args.n % world:
        ctx.error(f"-n {args.n} must be divisible by the {world} ranks (matmul_reduce_scatter)")
        return 2
    dtype, out_dtype = utils.torch_dtype(args.datatype), utils.torch_dtype(args.out_datatype)
    ok = True
    for op in OPS if args.op == "all" else [args.op]:
        a_shape, b_shape, out_shape = shapes(op, args.m, args.n, args.k, world)
        shards = []
        for r in range(world):  # every rank's operands, drawn from their seeds: for the float64 answer
            g = torch.Generator(device=device).manual_seed(100 + r)
            shards.append(((torch.randn(*a_shape, generator=g, device=device) / args.k ** 0.5).to(dtype),
                           torch.randn(*b_shape, generator=g, device=device).to(dtype)))
        a, b = shards[rank]
        make = ctx.full if op in ("matmul_all_gather", "gemm_all_scatter") else \
            (lambda shape, value, dtype: torch.full(shape, value, dtype=dtype, device=device))
        out = make(out_shape, float("nan"), dtype=out_dtype)  # poisoned: every element must be written
        call = getattr(ctx.ops, op)

        def run_iris(call=call, out=out, a=a, b=b):
            call(out, a, b)

        if args.validate:
            ctx.barrier()
            run_iris()
            ctx.barrier()
            want = answer(op, [(x.double(), y.double()) for x, y in shards], rank)
            scale = answer(op, [(x.double().abs(), y.double().abs()) for x, y in shards], rank).clamp(min=1e-3)
            error = ((out.double() - want).abs() / scale).max().item()
            good = error <= TOLERANCE[out_dtype] and not out.isnan().any().item()
            (ctx.log if good else ctx.error)(f"{op}: output {tuple(out.shape)} {args.out_datatype}, largest error "
                                             f"{error:.1e} of the terms' size: {'passed' if good else 'FAILED'}")
            ok &= good
        if args.benchmark:
            iris_ms = iris.do_bench(run_iris, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
            torch_ms = iris.do_bench(torch_version(op, out, a, b, world), ctx.barrier, n_warmup=args.num_warmup,
                                     n_repeat=args.num_experiments)
            if rank == 0:
                ctx.log_stats(f"{op} (M={args.m} N={args.n} K={args.k}, {args.datatype}, {world} ranks): iris "
                              f"{iris_ms:.3f} ms, torch.matmul + {dist.get_backend()} {torch_ms:.3f} ms "
                              f"({torch_ms / iris_ms:.2f}x)")
    if args.validate:
        ok = utils.all_passed(ctx, ok)
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
