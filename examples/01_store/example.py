"""Store: one rank writes into another rank's buffer with ``iris.store``; a bandwidth matrix over every pair.

For each (source, destination) pair, the source rank launches a kernel that reads its own buffer and
stores it, block by block, into the destination rank's result buffer (``iris.store`` translates the
pointer into the destination's heap). Nothing runs on the destination: after a barrier the data is
simply there. Every rank's data names the rank, so the destination can check who wrote it.

    iris run -n 2 examples/01_store/example.py --validate
    python examples/01_store/example.py --validate -r 2      # spawns its 2 ranks itself
"""

import sys
from pathlib import Path

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit
def store_kernel(source_buffer, result_buffer, n_elements, source_rank: tl.constexpr,
                 destination_rank: tl.constexpr, BLOCK_SIZE: tl.constexpr, heap_bases):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    data = tl.load(source_buffer + offsets, mask=mask)
    # Write into destination_rank's copy of result_buffer from the source rank (the current one).
    iris.store(result_buffer + offsets, data, source_rank, destination_rank, heap_bases, mask=mask)


def bench_pair(ctx, args, source_rank, destination_rank, source_buffer, result_buffer) -> tuple[float, bool]:
    """(GiB/s of source_rank storing into destination_rank, whether destination_rank got the right data)."""
    rank, n = ctx.get_rank(), source_buffer.numel()
    grid = (triton.cdiv(n, args.block_size),)

    def store():
        if rank == source_rank:
            store_kernel[grid](source_buffer, result_buffer, n, source_rank, destination_rank, args.block_size,
                               ctx.get_heap_bases())

    ms = iris.do_bench(store, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
    gbps = 0.0
    if rank == source_rank:
        gbps = n * source_buffer.element_size() / (ms * 1e-3) / 2**30
        if args.verbose:
            ctx.log_stats(f"store {source_rank} -> {destination_rank}: {gbps:.2f} GiB/s")
    gbps = ctx.broadcast(gbps, source_rank)
    ok = True
    if args.validate:
        result_buffer.fill_(-1)  # poison, then one more store to check
        ctx.barrier()
        store()
        ctx.barrier()  # the source's stores have landed on the destination
        if rank == destination_rank:
            want = utils.pattern(n, source_rank, source_buffer.dtype, source_buffer.device)
            ok = utils.check(ctx, f"rank {destination_rank} stored into by rank {source_rank}", result_buffer, want)
    ctx.barrier()
    return gbps, ok


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    n = utils.bytes_to_elements(args.buffer_size, dtype)
    ctx = iris.iris(args.heap_size or 2 * args.buffer_size + (1 << 24))
    rank = ctx.get_rank()
    source_buffer = ctx.zeros(n, dtype=dtype)
    source_buffer.copy_(utils.pattern(n, rank, dtype, source_buffer.device))  # says which rank wrote it
    result_buffer = ctx.zeros_like(source_buffer)
    ctx.barrier()
    return utils.every_pair(ctx, args, "store bandwidth, GiB/s (source rank writes destination rank)",
                            lambda source, destination: bench_pair(ctx, args, source, destination,
                                                                   source_buffer, result_buffer),
                            f"{n} {args.datatype}")


if __name__ == "__main__":
    sys.exit(utils.run(main, utils.bandwidth_args(__doc__)))
