"""Message passing: a producer rank sends blocks to a consumer rank, each block announced by a flag.

Rank 0 (the producer) moves each block of its buffer into rank 1's buffer, then raises that block's
flag on rank 1 with an atomic exchange at ``sem="release", scope="sys"``: the block's data becomes
visible on rank 1 no later than the flag. A scalar atomic is made by one thread of the program and its
release orders that thread's writes only, so a ``tl.debug_barrier()`` comes first (without it, on
2 x H200 about one element in 20,000 arrived after its flag); ``iris.signal`` does both. Rank 1 (the
consumer) spins on each flag with an acquire compare-and-swap that also resets it, passes a barrier
(every thread reads after the acquire), then reads the block, doubles it and keeps the result. Both
kernels run at the same time. Two ways to move the data (``--method``, default: both, one after the
other):

    load_store   the producer reads its block (tl.load) and writes it remotely (iris.store)
    put          one call copies the block from the producer's heap into the consumer's (iris.put)

    iris run -n 2 examples/06_message_passing/example.py --validate
    python examples/06_message_passing/example.py --validate -r 2 --method put
"""

import argparse
import sys
from pathlib import Path

import torch

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit
def producer_load_store(source, destination, flags, n, producer_rank: tl.constexpr, consumer_rank: tl.constexpr,
                        BLOCK_SIZE: tl.constexpr, heap_bases):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    values = tl.load(source + offsets, mask=mask)
    iris.store(destination + offsets, values, producer_rank, consumer_rank, heap_bases, mask=mask)
    # Release: the block above is visible on the consumer before its flag is. The release orders the writes of
    # the thread that makes the exchange; the barrier first puts every thread's stores before it.
    tl.debug_barrier()
    iris.atomic_xchg(flags + pid, 1, producer_rank, consumer_rank, heap_bases, sem="release", scope="sys")


@triton.jit
def producer_put(source, destination, flags, n, producer_rank: tl.constexpr, consumer_rank: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, heap_bases):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    iris.put(source + offsets, destination + offsets, producer_rank, consumer_rank, heap_bases, mask=offsets < n)
    tl.debug_barrier()  # every thread's part of the block before the flag (as above)
    iris.atomic_xchg(flags + pid, 1, producer_rank, consumer_rank, heap_bases, sem="release", scope="sys")


@triton.jit
def consumer(destination, result, flags, n, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    # Acquire: once the flag reads 1 the producer's block is visible here; the swap resets the flag.
    while tl.atomic_cas(flags + pid, 1, 0, sem="acquire", scope="sys") != 1:
        pass
    tl.debug_barrier()  # the acquire (one thread's) before any thread reads the block
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n
    tl.store(result + offsets, tl.load(destination + offsets, mask=mask) * 2, mask=mask)


PRODUCERS = {"load_store": producer_load_store, "put": producer_put}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("-t", "--datatype", default="fp32", choices=["fp16", "bf16", "fp32"], help="element type")
    parser.add_argument("-s", "--buffer_size", type=int, default=1 << 14 if utils.on_cpu() else 1 << 24,
                        help="elements sent")
    parser.add_argument("-b", "--block_size", type=int, default=1024, help="elements per block (and flag)")
    parser.add_argument("-p", "--heap_size", type=int, default=None, help="heap bytes (default: what it needs)")
    parser.add_argument("--method", default="both", choices=["load_store", "put", "both"], help="how data moves")
    parser.add_argument("-v", "--validate", action="store_true", help="check the result; exit non-zero if wrong")
    return utils.add_common_args(parser).parse_args()


def send(ctx, method, source, destination, result, flags, block_size) -> None:
    """One message: rank 0 produces every block for rank 1, which consumes them as they arrive."""
    n, rank = source.numel(), ctx.get_rank()
    grid = (triton.cdiv(n, block_size),)
    ctx.barrier()
    if rank == 0:
        PRODUCERS[method][grid](source, destination, flags, n, 0, 1, block_size, ctx.get_heap_bases())
    elif rank == 1:
        consumer[grid](destination, result, flags, n, block_size)
    ctx.barrier()


def main(args) -> int:
    ctx = iris.iris(args.heap_size or 4 * 4 * args.buffer_size + (1 << 24))
    rank = ctx.get_rank()
    if ctx.get_num_ranks() < 2:
        ctx.error("this example needs 2 ranks: iris run -n 2 examples/06_message_passing/example.py")
        return 2
    dtype = utils.torch_dtype(args.datatype)
    n = args.buffer_size
    g = torch.Generator(device=ctx.get_device()).manual_seed(1234)
    source = ctx.randn(n, generator=g, dtype=dtype)  # the same values on every rank: the consumer can check
    destination = ctx.full((n,), float("nan"), dtype=dtype)
    result = ctx.full((n,), float("nan"), dtype=dtype)
    flags = ctx.zeros(triton.cdiv(n, args.block_size), dtype=torch.int32)
    ok = True
    for method in (["load_store", "put"] if args.method == "both" else [args.method]):
        destination.fill_(float("nan"))  # poison what the producer writes and what the consumer computes
        result.fill_(float("nan"))
        send(ctx, method, source, destination, result, flags, args.block_size)
        if rank == 1:
            ctx.log(f"{method}: received {flags.numel()} blocks of {args.block_size} from rank 0")
            if args.validate:
                ok &= utils.check(ctx, f"{method}: consumer's result", result, source * 2)
        if rank > 1:
            ctx.log(f"{method}: idle (rank 0 sends to rank 1)")
    if args.validate:
        ok = utils.all_passed(ctx, ok)
        ctx.log(f"validation {'passed' if ok else 'FAILED'}: {n} {args.datatype} from rank 0 to rank 1")
    ctx.barrier()
    ctx.close()
    return 0 if ok or not args.validate else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
