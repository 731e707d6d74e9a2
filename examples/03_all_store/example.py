"""All store: every rank writes its buffer into every rank at the same time with ``iris.store``.

Each rank launches one kernel whose grid has a column of programs per peer: program (block, i) stores
block ``block`` of the local buffer into row ``rank`` of rank ``(rank + i) % world``'s result (each
rank starts with a different peer). After a barrier every rank holds every rank's data, row by row:
an all-gather written by hand with stores.

    iris run -n 2 examples/03_all_store/example.py --validate
    python examples/03_all_store/example.py --validate -r 2      # spawns its 2 ranks itself
"""

import sys
from pathlib import Path

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit
def all_store_kernel(source_buffer, result_buffer, n_elements, cur_rank, world_size, BLOCK_SIZE: tl.constexpr,
                     heap_bases):
    peer = (cur_rank + tl.program_id(1)) % world_size
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    data = tl.load(source_buffer + offsets, mask=mask)
    row = result_buffer + tl.cast(cur_rank, tl.int64) * n_elements  # this rank's row, on every rank
    iris.store(row + offsets, data, cur_rank, peer, heap_bases, mask=mask)


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    n = utils.bytes_to_elements(args.buffer_size, dtype)
    ctx = iris.iris(args.heap_size or 6 * args.buffer_size + (1 << 24))
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    source_buffer = ctx.zeros(n, dtype=dtype)
    source_buffer.copy_(utils.pattern(n, rank, dtype, source_buffer.device))  # says which rank wrote it
    result_buffer = ctx.zeros(world, n, dtype=dtype)  # row r: what rank r stored here
    grid = (triton.cdiv(n, args.block_size), world)

    def all_store():
        all_store_kernel[grid](source_buffer, result_buffer, n, rank, world, args.block_size, ctx.get_heap_bases())

    ctx.barrier()
    ms = iris.do_bench(all_store, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
    gbps = world * n * source_buffer.element_size() / (ms * 1e-3) / 2**30
    if args.verbose:
        ctx.log_stats(f"stored into {world} ranks {n} {args.datatype} each in {ms:.3f} ms: {gbps:.2f} GiB/s")
    utils.print_bandwidth_vector(ctx, gbps, "all-store bandwidth per rank, GiB/s (every rank writes every rank)",
                                 args.output_file)
    ok = True
    if args.validate:
        result_buffer.fill_(-1)  # poison, then one more round to check
        ctx.barrier()
        all_store()
        ctx.barrier()  # every rank's stores have landed everywhere
        for peer in range(world):
            want = utils.pattern(n, peer, dtype, source_buffer.device)
            ok &= utils.check(ctx, f"rank {rank}, row stored by rank {peer}", result_buffer[peer], want)
        ok = utils.all_passed(ctx, ok)
        ctx.log(f"validation {'passed' if ok else 'FAILED'}: {world} ranks each wrote {n} {args.datatype} "
                f"into {world} ranks")
    ctx.barrier()
    ctx.close()
    return 0 if ok or not args.validate else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, utils.bandwidth_args(__doc__)))
