"""Sweep launch shapes of put and get at one size (rank 0 -> rank 1), beside the copy engine.

    iris run -n 2 benchmarks/rma_sweep.py [size in MiB, default 256]

Tries plain grids and persistent grids (1-8 programs per SM), BLOCK x num_warps
from 2048x4 to 16384x16, and store cache modifiers; prints GB/s per shape. It
is how the launch shape of benchmarks/rma.py was checked (GPU backend only).
"""
import os
for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(k, v)
import sys
import torch
import iris
import triton
import triton.language as tl
from rma import median_us  # benchmarks/ is on sys.path when this runs as a script


@triton.jit(do_not_specialize=["cur_rank", "peer"])
def put_persistent(src, dst, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr, CACHE: tl.constexpr,
                   GET: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    for b in range(pid, tl.cdiv(n, BLOCK), nprog):
        offs = b * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        if GET:
            iris.get(src + offs, dst + offs, peer, cur_rank, heap_bases, mask=mask)
        else:
            data = tl.load(src + offs, mask=mask)
            iris.store(dst + offs, data, cur_rank, peer, heap_bases, mask=mask, cache_modifier=CACHE)


def gpu_median_us(fn):
    return median_us(fn, warmup=3, iters=20, gpu=True)


def main():
    size = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 256 << 20
    ctx = iris.iris(2 * size + (1 << 20))
    n = size // 2
    src = ctx.randn(n, dtype=torch.bfloat16)
    dst = ctx.empty(n, dtype=torch.bfloat16)
    ctx.barrier()
    if ctx.get_rank() == 0:
        sms = ctx.get_cu_count()
        hb = ctx.get_heap_bases()
        peer_buf = torch.empty(n, dtype=torch.bfloat16, device="cuda:1")
        ce = gpu_median_us(lambda: peer_buf.copy_(src))
        print(f"copy_engine {size / ce / 1e3:.1f} GB/s")
        for get in (False, True):
            for block, warps in ((2048, 4), (4096, 8), (8192, 8), (8192, 16), (16384, 16)):
                for mult in (0, 1, 2, 4, 8):
                    for cache in ("", ".cs", ".wt") if not get else ("",):
                        grid = triton.cdiv(n, block) if mult == 0 else sms * mult
                        def launch(grid=grid, block=block, cache=cache, get=get, warps=warps):
                            put_persistent[(grid,)](src, dst, n, 0, 1, hb, BLOCK=block, CACHE=cache, GET=get,
                                                    num_warps=warps)

                        us = gpu_median_us(launch)
                        shape = f"block={block} warps={warps} grid={'full' if mult == 0 else f'{mult}xSM'}"
                        print(f"{'get' if get else 'put'} {shape} cache={cache or '-'}: {size / us / 1e3:.1f} GB/s",
                              flush=True)
    ctx.barrier()
    ctx.close()


if __name__ == "__main__":
    main()
