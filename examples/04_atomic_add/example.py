"""Atomic add: one rank adds into another rank's buffer with ``iris.atomic_add``; a matrix over every pair.

For each (source, destination) pair, the source rank launches a kernel that atomically adds
``source + 1`` to every element of the destination rank's buffer (``sem="relaxed"``: nothing else is
ordered by it; ``scope="sys"``: another GPU, or another process, sees it). The destination checks
that each element grew by exactly that much. Adds from several ranks into one element are safe: try
``iris run -n 4`` and every rank adds into every rank in turn.

    iris run -n 2 examples/04_atomic_add/example.py --validate
    python examples/04_atomic_add/example.py --validate -r 2      # spawns its 2 ranks itself
"""

import sys
from pathlib import Path

import torch

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit
def atomic_add_kernel(result_buffer, n_elements, source_rank: tl.constexpr, destination_rank: tl.constexpr,
                      BLOCK_SIZE: tl.constexpr, heap_bases):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    iris.atomic_add(result_buffer + offsets, source_rank + 1, source_rank, destination_rank, heap_bases, mask=mask,
                    sem="relaxed", scope="sys")


def bench_pair(ctx, args, source_rank, destination_rank, result_buffer) -> tuple[float, bool]:
    """(GiB/s of source_rank adding into destination_rank, whether each element grew by source_rank + 1)."""
    rank, n = ctx.get_rank(), result_buffer.numel()
    grid = (triton.cdiv(n, args.block_size),)
    start = utils.pattern(n, destination_rank, result_buffer.dtype, result_buffer.device)

    def atomic_add():
        if rank == source_rank:
            atomic_add_kernel[grid](result_buffer, n, source_rank, destination_rank, args.block_size,
                                    ctx.get_heap_bases())

    ms = iris.do_bench(atomic_add, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
    gbps = 0.0
    if rank == source_rank:
        gbps = n * result_buffer.element_size() / (ms * 1e-3) / 2**30
        if args.verbose:
            ctx.log_stats(f"atomic_add {source_rank} -> {destination_rank}: {gbps:.2f} GiB/s")
    gbps = ctx.broadcast(gbps, source_rank)
    ok = True
    if args.validate:
        result_buffer.copy_(start)  # a known start: the timed runs added an unknown number of times
        ctx.barrier()
        atomic_add()
        ctx.barrier()
        if rank == destination_rank:
            want = (start.to(torch.float64) + source_rank + 1).to(result_buffer.dtype)
            ok = utils.check(ctx, f"rank {destination_rank} added into by rank {source_rank}", result_buffer, want)
    ctx.barrier()
    return gbps, ok


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    n = utils.bytes_to_elements(args.buffer_size, dtype)
    ctx = iris.iris(args.heap_size or args.buffer_size + (1 << 24))
    result_buffer = ctx.zeros(n, dtype=dtype)
    ctx.barrier()
    return utils.every_pair(ctx, args, "atomic_add bandwidth, GiB/s (source rank adds into destination rank)",
                            lambda source, destination: bench_pair(ctx, args, source, destination,
                                                                   result_buffer),
                            f"{n} {args.datatype}")


if __name__ == "__main__":
    # int8 has no atomic add in Triton; bf16 atomics need an sm_90 GPU or AMD (not the CPU backend).
    sys.exit(utils.run(main, utils.bandwidth_args(__doc__, "fp16", ("fp16", "bf16", "fp32", "int32"))))
