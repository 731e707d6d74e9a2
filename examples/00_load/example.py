"""Load: one rank reads another rank's buffer with ``iris.load``; a bandwidth matrix over every pair.

For each (source, destination) pair of ranks, the source rank launches a kernel that loads the
destination rank's buffer, block by block, through its heap (``iris.load`` translates the local
pointer into the destination's address space), and writes it into a local result buffer. Every
rank fills its buffer with values that name the rank, so the result says whose memory was read.

    iris run -n 2 examples/00_load/example.py --validate
    python examples/00_load/example.py --validate -r 2      # spawns its 2 ranks itself
"""

import sys
from pathlib import Path

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit
def load_kernel(source_buffer, result_buffer, n_elements, source_rank: tl.constexpr,
                destination_rank: tl.constexpr, BLOCK_SIZE: tl.constexpr, heap_bases):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    # Read destination_rank's copy of source_buffer from the source rank (the current one).
    data = iris.load(source_buffer + offsets, source_rank, destination_rank, heap_bases, mask=mask)
    tl.store(result_buffer + offsets, data, mask=mask)


@triton.jit
def fill_kernel(result_buffer, n_elements, BLOCK_SIZE: tl.constexpr):
    """The same launch and local store without the remote read: its time is subtracted."""
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.store(result_buffer + offsets, 0, mask=offsets < n_elements)


def bench_pair(ctx, args, source_rank, destination_rank, source_buffer, result_buffer) -> tuple[float, bool]:
    """(GiB/s of source_rank loading destination_rank's buffer, whether the result was right)."""
    rank, n = ctx.get_rank(), source_buffer.numel()
    grid = (triton.cdiv(n, args.block_size),)

    def fill():
        if rank == source_rank:
            fill_kernel[grid](result_buffer, n, args.block_size)

    def load():
        if rank == source_rank:
            load_kernel[grid](source_buffer, result_buffer, n, source_rank, destination_rank, args.block_size,
                              ctx.get_heap_bases())

    fill_ms = iris.do_bench(fill, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
    load_ms = iris.do_bench(load, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
    gbps = 0.0
    if rank == source_rank:
        seconds = max(load_ms - fill_ms, 1e-6) * 1e-3
        gbps = n * source_buffer.element_size() / seconds / 2**30
        if args.verbose:
            ctx.log_stats(f"load {source_rank} <- {destination_rank}: {gbps:.2f} GiB/s")
    gbps = ctx.broadcast(gbps, source_rank)
    ok = True
    if args.validate:
        result_buffer.fill_(-1)  # poison, then one more load to check
        ctx.barrier()
        load()
        ctx.barrier()
        if rank == source_rank:
            want = utils.pattern(n, destination_rank, source_buffer.dtype, source_buffer.device)
            ok = utils.check(ctx, f"rank {source_rank} loading rank {destination_rank}", result_buffer, want)
    ctx.barrier()
    return gbps, ok


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    n = utils.bytes_to_elements(args.buffer_size, dtype)
    ctx = iris.iris(args.heap_size or 2 * args.buffer_size + (1 << 24))
    rank = ctx.get_rank()
    source_buffer = ctx.zeros(n, dtype=dtype)
    source_buffer.copy_(utils.pattern(n, rank, dtype, source_buffer.device))  # says which rank it is on
    result_buffer = ctx.zeros_like(source_buffer)
    ctx.barrier()
    return utils.every_pair(ctx, args, "load bandwidth, GiB/s (source rank reads destination rank)",
                            lambda source, destination: bench_pair(ctx, args, source, destination,
                                                                   source_buffer, result_buffer),
                            f"{n} {args.datatype}")


if __name__ == "__main__":
    sys.exit(utils.run(main, utils.bandwidth_args(__doc__)))
