"""Producer/consumer across ranks with a release/acquire flag.

Rank 0 (producer) puts each block of its data into rank 1's buffer, then raises
that block's flag on rank 1 with a release store at system scope. Rank 1
(consumer) spins on each flag with acquire semantics, then reads the block
and checks it. Both kernels run at the same time.

    iris run -n 2 examples/01_message_passing/example.py --validate
"""

import argparse
import sys

import torch

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl


@triton.jit
def producer(src, dst, flags, n, producer_rank, consumer_rank, heap_bases, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    iris.put(src + offs, dst + offs, producer_rank, consumer_rank, heap_bases, mask=offs < n)
    # Release: the data above is visible on the consumer before the flag is.
    iris.atomic_xchg(flags + pid, 1, producer_rank, consumer_rank, heap_bases, sem="release", scope="sys")


@triton.jit
def consumer(dst, out, flags, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    # Acquire: once the flag reads 1, the producer's data is visible here.
    while tl.atomic_cas(flags + pid, 1, 0, sem="acquire", scope="sys") != 1:
        pass
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(dst + offs, mask=offs < n) * 2, mask=offs < n)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validate", action="store_true", help="exit non-zero when the result is wrong")
    parser.add_argument("--elements", type=int, default=1 << 14)
    parser.add_argument("--block", type=int, default=1024)
    args = parser.parse_args()

    ctx = iris.iris(heap_size=1 << 26)
    rank = ctx.get_rank()
    if ctx.get_num_ranks() < 2:
        ctx.error("this example needs 2 ranks: iris run -n 2 examples/01_message_passing/example.py")
        return 2
    n, block = args.elements, args.block
    blocks = triton.cdiv(n, block)
    g = torch.Generator(device=ctx.get_device()).manual_seed(1234)
    src = ctx.randn(n, generator=g, dtype=torch.float32)  # same values on every rank: the consumer can check
    dst = ctx.full((n,), float("nan"), dtype=torch.float32)
    out = ctx.full((n,), float("nan"), dtype=torch.float32)
    flags = ctx.zeros(blocks, dtype=torch.int32)
    ctx.barrier()
    if rank == 0:
        producer[(blocks,)](src, dst, flags, n, 0, 1, ctx.get_heap_bases(), BLOCK=block)
    elif rank == 1:
        consumer[(blocks,)](dst, out, flags, n, BLOCK=block)
    ctx.barrier()
    status = 0
    if rank == 1:
        wrong = int((out != src * 2).sum())
        print(f"rank 1: consumed {blocks} blocks of {block}; {wrong} of {n} elements wrong")
        status = 1 if (wrong and args.validate) else 0
    ctx.barrier()
    ctx.close()
    return status


if __name__ == "__main__":
    sys.exit(main())
