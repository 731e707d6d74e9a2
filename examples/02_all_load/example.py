"""All load: every rank reads every rank's buffer at the same time with ``iris.load``.

Each rank launches one kernel whose grid has a column of programs per peer: program (block, i) reads
block ``block`` of rank ``(rank + i) % world``'s buffer (each rank starts with a different peer, so
no rank is read by everyone at once) into slot ``i`` of a local result. All ranks run together: the
figure is each rank's incoming bandwidth while every link is busy in both directions.

    iris run -n 2 examples/02_all_load/example.py --validate
    python examples/02_all_load/example.py --validate -r 2      # spawns its 2 ranks itself
"""

import sys
from pathlib import Path

import iris  # before any kernel: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit
def all_load_kernel(source_buffer, result_buffer, n_elements, cur_rank, world_size, BLOCK_SIZE: tl.constexpr,
                    heap_bases):
    peer = (cur_rank + tl.program_id(1)) % world_size
    offsets = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    data = iris.load(source_buffer + offsets, cur_rank, peer, heap_bases, mask=mask)
    tl.store(result_buffer + peer.to(tl.int64) * n_elements + offsets, data, mask=mask)


def main(args) -> int:
    dtype = utils.torch_dtype(args.datatype)
    n = utils.bytes_to_elements(args.buffer_size, dtype)
    ctx = iris.iris(args.heap_size or 6 * args.buffer_size + (1 << 24))
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    source_buffer = ctx.zeros(n, dtype=dtype)
    source_buffer.copy_(utils.pattern(n, rank, dtype, source_buffer.device))  # says which rank it is on
    result_buffer = ctx.zeros(world, n, dtype=dtype)  # row r: what was read from rank r
    grid = (triton.cdiv(n, args.block_size), world)

    def all_load():
        all_load_kernel[grid](source_buffer, result_buffer, n, rank, world, args.block_size, ctx.get_heap_bases())

    ctx.barrier()
    ms = iris.do_bench(all_load, ctx.barrier, n_warmup=args.num_warmup, n_repeat=args.num_experiments)
    gbps = world * n * source_buffer.element_size() / (ms * 1e-3) / 2**30
    if args.verbose:
        ctx.log_stats(f"read {world} buffers of {n} {args.datatype} in {ms:.3f} ms: {gbps:.2f} GiB/s")
    utils.print_bandwidth_vector(ctx, gbps, "all-load bandwidth per rank, GiB/s (every rank reads every rank)",
                                 args.output_file)
    ok = True
    if args.validate:
        result_buffer.fill_(-1)  # poison, then one more round to check
        ctx.barrier()
        all_load()
        ctx.barrier()
        for peer in range(world):
            want = utils.pattern(n, peer, dtype, source_buffer.device)
            ok &= utils.check(ctx, f"rank {rank} loading rank {peer}", result_buffer[peer], want)
        ok = utils.all_passed(ctx, ok)
        ctx.log(f"validation {'passed' if ok else 'FAILED'}: {world} ranks each read {world} x {n} {args.datatype}")
    ctx.barrier()
    ctx.close()
    return 0 if ok or not args.validate else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, utils.bandwidth_args(__doc__)))
