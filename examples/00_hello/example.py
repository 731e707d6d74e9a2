"""Hello, symmetric heap: rank 0 stores ones into rank 1's buffer; rank 1 checks.

Run it as two ranks with the launcher (any backend; the CPU one where no GPU is):

    iris run -n 2 examples/00_hello/example.py --validate

or, as in the original's first example, let the script spawn its ranks itself
(torch.multiprocessing + init_process_group):

    python examples/00_hello/example.py --validate
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import iris  # import before defining kernels: on the CPU backend it turns on Triton's interpreter
import triton
import triton.language as tl


@triton.jit
def kernel(buffer, buffer_size: tl.constexpr, block_size: tl.constexpr, heap_bases_ptr):
    pid = tl.program_id(0)
    offsets = pid * block_size + tl.arange(0, block_size)
    mask = offsets < buffer_size
    source_rank = 0
    target_rank = 1
    iris.store(buffer + offsets, 1, source_rank, target_rank, heap_bases_ptr, mask=mask)


def hello(validate: bool) -> int:
    ctx = iris.iris(heap_size=1 << 24)
    rank = ctx.get_rank()
    if ctx.get_num_ranks() < 2:
        ctx.error("this example needs at least 2 ranks: iris run -n 2 examples/00_hello/example.py")
        return 2
    buffer_size, block_size = 4096, 1024
    buffer = ctx.zeros(buffer_size, device="cuda", dtype=torch.float32)
    ctx.barrier()
    if rank == 0:
        grid = (triton.cdiv(buffer_size, block_size),)
        kernel[grid](buffer, buffer_size, block_size, ctx.get_heap_bases())
    ctx.barrier()
    if rank == 0:
        print(f"rank 0: stored {buffer_size} ones into rank 1's buffer")
    elif rank > 1:
        print(f"rank {rank}: idle (the example stores from rank 0 to rank 1)")
    status = 0
    if rank == 1:
        expected = torch.ones(buffer_size, dtype=torch.float32, device=buffer.device)
        if torch.equal(buffer, expected):
            print(f"rank 1: received {buffer_size} ones from rank 0")
        else:
            wrong = int((buffer != expected).sum())
            print(f"rank 1: {wrong} of {buffer_size} elements are wrong")
            status = 1 if validate else 0
    ctx.barrier()
    ctx.close()
    return status


def _spawned_worker(rank, world_size, port, validate, statuses):
    backend = "gloo" if iris.runtime.SELECTED == "cpu" else "nccl"
    kwargs = {} if backend == "gloo" else {"device_id": torch.device("cuda", rank % torch.cuda.device_count())}
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size,
                            init_method=f"tcp://127.0.0.1:{port}", **kwargs)
    statuses[rank] = hello(validate)
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--validate", action="store_true", help="exit non-zero when the result is wrong")
    parser.add_argument("--world-size", type=int, default=2, help="ranks to spawn when not started by a launcher")
    args = parser.parse_args()
    if "RANK" in os.environ or "OMPI_COMM_WORLD_SIZE" in os.environ:
        return hello(args.validate)
    from iris.launch import free_port

    statuses = mp.Manager().list([1] * args.world_size)
    mp.spawn(_spawned_worker, args=(args.world_size, free_port(), args.validate, statuses),
             nprocs=args.world_size, join=True)
    return max(statuses)


if __name__ == "__main__":
    sys.exit(main())
