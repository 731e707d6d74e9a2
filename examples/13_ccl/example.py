"""Collectives: ``ctx.ccl`` all_reduce, all_gather, reduce_scatter, all_to_all and broadcast, checked and timed.

Each is one call on tensors allocated on the symmetric heap, with torch.distributed's argument order
(output first). Every rank draws its input from a seed of its own, so every rank can compute every
collective's answer in float64 on its own and check it. ``--benchmark`` times each call with
``iris.do_bench`` beside the same collective of torch.distributed (NCCL on GPUs, gloo on the CPU).

    iris run -n 2 examples/13_ccl/example.py --validate
    python examples/13_ccl/example.py --validate --benchmark -r 2 --collective all_reduce
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import iris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402

COLLECTIVES = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 2e-2, torch.float32: 1e-5}  # relative, per element


def parse_args():
    cpu = utils.on_cpu()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-m", type=int, default=64 if cpu else 8192, help="rows of each rank's tensor")
    parser.add_argument("-n", type=int, default=64 if cpu else 4096, help="columns of each rank's tensor")
    parser.add_argument("--datatype", default="fp32", choices=["fp16", "bf16", "fp32"], help="element type")
    parser.add_argument("--collective", default="all", choices=["all", *COLLECTIVES], help="which to run")
    parser.add_argument("-v", "--validate", action="store_true", help="check against float64; exit non-zero if wrong")
    parser.add_argument("-b", "--benchmark", action="store_true", help="time it beside torch.distributed")
    parser.add_argument("--num_experiments", type=int, default=2 if cpu else 50, help="timed runs (--benchmark)")
    parser.add_argument("--num_warmup", type=int, default=1 if cpu else 10, help="untimed runs first")
    return utils.add_common_args(parser).parse_args()


def rank_input(rank: int, shape, dtype, device) -> torch.Tensor:
    """Rank ``rank``'s input: any rank can draw it, to compute the expected answer."""
    g = torch.Generator(device=device).manual_seed(1000 + rank)
    return torch.randn(*shape, generator=g, device=device).to(dtype)


def collective(ctx, name: str, m: int, n: int, dtype):
    """(iris call, torch.distributed call, output, expected float64 answer) of one collective on this rank."""
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    every = [rank_input(r, (world * m, n), dtype, device) for r in range(world)]  # every rank's input
    x = ctx.empty(world * m, n, dtype=dtype)  # on the heap: the collectives read peers' inputs there
    x.copy_(every[rank])
    reference = torch.empty_like(every[rank])
    if name == "all_reduce":
        out, want = ctx.empty(world * m, n, dtype=dtype), sum(e.double() for e in every)
        return (lambda: ctx.ccl.all_reduce(out, x)), (lambda: dist.all_reduce(reference.copy_(x))), out, want
    if name == "all_gather":
        x_part = x[:m]
        out, want = ctx.empty(world * m, n, dtype=dtype), torch.cat([e[:m] for e in every]).double()
        gathered = torch.empty(world * m, n, dtype=dtype, device=device)
        return (lambda: ctx.ccl.all_gather(out, x_part)), \
            (lambda: dist.all_gather(list(gathered.chunk(world)), x_part.contiguous())), out, want
    if name == "reduce_scatter":  # torch's layout: (W*M, N) in, rank r gets rows [r*M, (r+1)*M) summed
        out = ctx.empty(m, n, dtype=dtype)
        want = sum(e.double() for e in every)[rank * m:(rank + 1) * m]
        part = torch.empty(m, n, dtype=dtype, device=device)
        return (lambda: ctx.ccl.reduce_scatter(out, x)), \
            (lambda: dist.reduce_scatter(part, list(x.chunk(world)))), out, want
    if name == "all_to_all":  # (M, W*N): rank i's column block j goes to rank j's column block i
        xt = x.view(m, world * n)
        out = ctx.empty(m, world * n, dtype=dtype)
        want = torch.cat([e.view(m, world * n)[:, rank * n:(rank + 1) * n] for e in every], dim=1).double()
        outs = [torch.empty(m, n, dtype=dtype, device=device) for _ in range(world)]
        ins = [c.contiguous() for c in xt.chunk(world, dim=1)]
        return (lambda: ctx.ccl.all_to_all(out, xt)), (lambda: dist.all_to_all(outs, ins)), out, want
    # broadcast: rank 0's tensor into everyone's, in place
    out, want = ctx.empty(world * m, n, dtype=dtype), every[0].double()

    def iris_broadcast():
        out.copy_(x)
        ctx.ccl.broadcast(out, src=0)

    return iris_broadcast, (lambda: dist.broadcast(reference.copy_(x), src=0)), out, want


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    ctx = iris.iris(1 << 26 if utils.on_cpu() else 1 << 33)
    world = ctx.get_num_ranks()
    names = COLLECTIVES if args.collective == "all" else [args.collective]
    ok = True
    for name in names:
        run_iris, run_torch, out, want = collective(ctx, name, args.m, args.n, dtype)
        if args.validate:
            out.fill_(float("nan"))  # poison
            ctx.barrier()
            run_iris()
            ctx.barrier()
            error = ((out.double() - want).abs() / want.abs().clamp(min=1)).max().item()
            good = error <= TOLERANCE[dtype] * world and not out.isnan().any().item()
            (ctx.log if good else ctx.error)(f"{name}: output {tuple(out.shape)}, largest relative error "
                                             f"{error:.1e}: {'passed' if good else 'FAILED'}")
            ok &= good
        if args.benchmark:
            iris_ms = iris.do_bench(run_iris, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
            # gloo (the CPU, or several ranks on one GPU) has no all_to_all of GPU tensors
            gloo_gpu = dist.get_backend() == "gloo" and out.is_cuda
            torch_ms = None if name == "all_to_all" and gloo_gpu else \
                iris.do_bench(run_torch, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
            if ctx.get_rank() == 0:
                beside = "not available" if torch_ms is None else \
                    f"{torch_ms * 1e3:.1f} us ({torch_ms / iris_ms:.2f}x)"
                ctx.log_stats(f"{name} (-m {args.m} -n {args.n}, {args.datatype}, {world} ranks): iris "
                              f"{iris_ms * 1e3:.1f} us, torch.distributed ({dist.get_backend()}) {beside}")
    if args.validate:
        ok = utils.all_passed(ctx, ok)
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
