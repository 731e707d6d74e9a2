"""Device context: a ring all-gather written with ``iris.DeviceContext``, the device API with the rank implicit.

``ctx.get_device_context()`` is one tensor that carries the current rank, the world size and every
rank's heap base; a kernel turns it into a ``DeviceContext`` with ``DeviceContext.initialize(context,
RANK, WORLD)`` and then calls ``load``/``store``/``put``/``get``/atomics/``signal``/``wait_until``
naming only the peer. Here every rank's chunk travels around the ring: at step s each rank puts the
chunk it got at step s - 1 (its own at step 0) into its right neighbour's output, then signals that
neighbour (release); before forwarding, it waits for its left neighbour's signal (acquire). After
W - 1 steps every rank holds every chunk. Each program moves one block of every chunk and waits only
on the same program of the left neighbour; flags hold the call's number, so nothing is reset.

    iris run -n 2 examples/16_device_context/example.py --validate
    python examples/16_device_context/example.py --validate --benchmark -r 2
"""

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import iris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit(do_not_specialize=["call"])  # a new number each call: one compiled kernel for all
def ring_all_gather(context, source, output, flags, call, n, RANK: tl.constexpr, WORLD: tl.constexpr,
                    BLOCK_SIZE: tl.constexpr):
    dctx = iris.DeviceContext.initialize(context, RANK, WORLD)
    pid = tl.program_id(0)
    right = (RANK + 1) % WORLD
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    own = output + RANK * n + offsets
    tl.store(own, tl.load(source + offsets, mask=mask), mask=mask)  # this rank's chunk, in its place
    for step in range(0, WORLD - 1):
        chunk = (RANK + WORLD - step) % WORLD  # the chunk this rank holds and forwards at this step
        if step > 0:  # it arrived from the left neighbour at the previous step
            dctx.wait_until(flags + (step - 1) * tl.num_programs(0) + pid, "==", call)
        place = output + chunk * n + offsets
        dctx.put(place, place, right, mask=mask)  # local block -> the same place on the right neighbour
        dctx.signal(flags + step * tl.num_programs(0) + pid, call, right)  # release: the block first


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-s", "--buffer_size", type=int, default=1 << 13 if utils.on_cpu() else 1 << 24,
                        help="elements per rank")
    parser.add_argument("-b", "--block_size", type=int, default=1024 if utils.on_cpu() else 4096,
                        help="elements per program")
    parser.add_argument("--datatype", default="fp32", choices=["fp16", "bf16", "fp32", "int32"], help="element type")
    parser.add_argument("-v", "--validate", action="store_true", help="check every chunk; exit non-zero if wrong")
    parser.add_argument("--benchmark", action="store_true", help="time it beside ctx.ccl.all_gather")
    parser.add_argument("--num_experiments", type=int, default=2 if utils.on_cpu() else 50, help="timed runs")
    parser.add_argument("--num_warmup", type=int, default=1 if utils.on_cpu() else 10, help="untimed runs first")
    return utils.add_common_args(parser).parse_args()


def main(args) -> int:
    dtype, n = utils.torch_dtype(args.datatype), args.buffer_size
    ctx = iris.iris(4 * n * 16 + (1 << 24))
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    source = ctx.zeros(n, dtype=dtype)
    source.copy_(utils.pattern(n, rank, dtype, source.device))  # says which rank it came from
    output = ctx.zeros(world * n, dtype=dtype)  # on the heap: the left neighbour puts into it
    blocks = triton.cdiv(n, args.block_size)
    flags = ctx.zeros(max(1, world - 1) * blocks, dtype=torch.int32)
    calls = [0]

    def ring():
        calls[0] += 1
        ring_all_gather[(blocks,)](ctx.get_device_context(), source, output, flags, calls[0], n, RANK=rank,
                                   WORLD=world, BLOCK_SIZE=args.block_size)
        ctx.barrier()  # the last step's puts have landed (nobody waits for them in the kernel)

    ok = True
    if args.validate:
        output.fill_(-1)  # poison
        ctx.barrier()
        ring()
        want = torch.cat([utils.pattern(n, r, dtype, source.device) for r in range(world)])
        ok = utils.all_passed(ctx, utils.check(ctx, f"rank {rank}'s gathered output", output, want))
        ctx.log(f"ring all-gather of {world} x {n} {args.datatype}: validation {'passed' if ok else 'FAILED'}")
    if args.benchmark:
        ring_ms = iris.do_bench(ring, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
        ccl_ms = iris.do_bench(lambda: ctx.ccl.all_gather(output, source), ctx.barrier, n_warmup=args.num_warmup,
                               n_repeat=args.num_experiments)
        if rank == 0:
            ctx.log_stats(f"ring all-gather by hand {ring_ms * 1e3:.1f} us, ctx.ccl.all_gather {ccl_ms * 1e3:.1f} us "
                          f"({world} ranks, {n} {args.datatype} each)")
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
