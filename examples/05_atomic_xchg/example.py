"""Atomic exchange: one rank swaps values into another rank's buffer with ``iris.atomic_xchg``.

For each (source, destination) pair, the source rank launches a kernel that atomically exchanges
every element of the destination rank's buffer for ``source + 1`` and keeps what it took out (the
old value ``atomic_xchg`` returns) in a local buffer. The destination checks it now holds the new
values; the source checks it took out the destination's old ones. An exchange is how a rank claims
a slot or hands over a flag; 06_message_passing uses one with ``sem="release"``.

    iris run -n 2 examples/05_atomic_xchg/example.py --validate
    python examples/05_atomic_xchg/example.py --validate -r 2      # spawns its 2 ranks itself
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
def atomic_xchg_kernel(result_buffer, old_buffer, n_elements, source_rank: tl.constexpr,
                       destination_rank: tl.constexpr, BLOCK_SIZE: tl.constexpr, heap_bases):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    old = iris.atomic_xchg(result_buffer + offsets, source_rank + 1, source_rank, destination_rank, heap_bases,
                           mask=mask, sem="relaxed", scope="sys")
    tl.store(old_buffer + offsets, old, mask=mask)


def bench_pair(ctx, args, source_rank, destination_rank, result_buffer, old_buffer) -> tuple[float, bool]:
    """(GiB/s of source_rank exchanging into destination_rank, whether both sides hold what they should)."""
    rank, n = ctx.get_rank(), result_buffer.numel()
    grid = (triton.cdiv(n, args.block_size),)

    def atomic_xchg():
        if rank == source_rank:
            atomic_xchg_kernel[grid](result_buffer, old_buffer, n, source_rank, destination_rank, args.block_size,
                                     ctx.get_heap_bases())

    ms = iris.do_bench(atomic_xchg, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
    gbps = 0.0
    if rank == source_rank:
        gbps = n * result_buffer.element_size() / (ms * 1e-3) / 2**30
        if args.verbose:
            ctx.log_stats(f"atomic_xchg {source_rank} -> {destination_rank}: {gbps:.2f} GiB/s")
    gbps = ctx.broadcast(gbps, source_rank)
    ok = True
    if args.validate:
        result_buffer.copy_(utils.pattern(n, rank, result_buffer.dtype, result_buffer.device))  # what is taken out
        old_buffer.fill_(-1)  # poison
        ctx.barrier()
        atomic_xchg()
        ctx.barrier()
        if rank == destination_rank:
            want = torch.full_like(result_buffer, source_rank + 1)
            ok &= utils.check(ctx, f"rank {destination_rank} exchanged into by rank {source_rank}", result_buffer,
                              want)
        if rank == source_rank:
            want = utils.pattern(n, destination_rank, result_buffer.dtype, result_buffer.device)
            ok &= utils.check(ctx, f"old values rank {source_rank} took from rank {destination_rank}", old_buffer,
                              want)
    ctx.barrier()
    return gbps, ok


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    n = utils.bytes_to_elements(args.buffer_size, dtype)
    ctx = iris.iris(args.heap_size or 2 * args.buffer_size + (1 << 24))
    result_buffer = ctx.zeros(n, dtype=dtype)
    old_buffer = ctx.zeros_like(result_buffer)
    ctx.barrier()
    return utils.every_pair(ctx, args, "atomic_xchg bandwidth, GiB/s (source rank swaps into destination rank)",
                            lambda source, destination: bench_pair(ctx, args, source, destination,
                                                                   result_buffer, old_buffer),
                            f"{n} {args.datatype}")


if __name__ == "__main__":
    # atomic_xchg exchanges 32- and 64-bit words on GPUs.
    sys.exit(utils.run(main, utils.bandwidth_args(__doc__, "fp32", ("fp32", "int32"))))
