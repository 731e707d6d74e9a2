"""Probe: do Hopper bulk copies (TMA tensor descriptors) move one-way NVLink traffic faster than SM loads/stores?

    iris run -n 2 benchmarks/probes/rma_tma_probe.py        (NVIDIA Hopper, one rank per GPU)

Rank 0 times, in one run, bf16 at 64 and 256 MiB: the copy engine (`dst.copy_(src)` to the peer's GPU),
iris.put with SM stores, and a persistent kernel whose descriptors point at the peer's heap through
iris.translate: mode 0 put (TMA load local, TMA store remote), mode 1 put (tl.load local, TMA store
remote), mode 2 get (TMA load remote, TMA store local), over tile shapes, pipeline depths and grids.
Rank 1 then checks that a TMA put delivered rank 0's data exactly.
Result on 2 x H200: benchmarks/probes/README.md (the output in git history).
"""
import os
for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(k, v)
import statistics
import torch
import iris
import triton
import triton.language as tl

triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


@triton.jit
def sm_put(src, dst, n, cur_rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    iris.put(src + offs, dst + offs, cur_rank, peer, heap_bases, mask=offs < n)


@triton.jit
def tma_copy(src, dst, M, cur_rank, peer, heap_bases, N: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
             STAGES: tl.constexpr, MODE: tl.constexpr):
    # MODE 0: put, TMA load local + TMA store remote; 1: put, tl.load local + TMA store remote;
    # 2: get, TMA load remote + TMA store local
    if MODE == 2:
        src = iris.translate(src, cur_rank, peer, heap_bases)
    else:
        dst = iris.translate(dst, cur_rank, peer, heap_bases)
    src_desc = tl.make_tensor_descriptor(src, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    dst_desc = tl.make_tensor_descriptor(dst, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
    tiles_n: tl.constexpr = N // BN
    ntiles = (M // BM) * tiles_n
    for t in tl.range(tl.program_id(0), ntiles, tl.num_programs(0), num_stages=STAGES):
        m = (t // tiles_n) * BM
        c = (t % tiles_n) * BN
        if MODE == 1:
            rows = m + tl.arange(0, BM)
            cols = c + tl.arange(0, BN)
            x = tl.load(src + rows[:, None] * N + cols[None, :])
        else:
            x = src_desc.load([m, c])
        dst_desc.store([m, c], x)


def timed(fn, iters=20, warmup=3):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts)


def main():
    ctx = iris.iris(1 << 31)
    rank = ctx.get_rank()
    sms = ctx.get_cu_count()
    hb = ctx.get_heap_bases()
    N = 1024
    for size_mib in (64, 256):
        nbytes = size_mib << 20
        n = nbytes // 2
        M = n // N
        src = ctx.randn(n, dtype=torch.bfloat16)
        dst = ctx.zeros(n, dtype=torch.bfloat16)
        ctx.barrier()
        if rank == 0:
            peer_dev = torch.device("cuda", 1 % torch.cuda.device_count())
            ce_dst = torch.empty(n, dtype=torch.bfloat16, device=peer_dev)
            t = timed(lambda: ce_dst.copy_(src))
            print(f"{size_mib}MiB copy_engine {nbytes / t / 1e9:.1f} GB/s", flush=True)
            t = timed(lambda: sm_put[(triton.cdiv(n, 8192),)](src, dst, n, 0, 1, hb, BLOCK=8192, num_warps=16))
            print(f"{size_mib}MiB sm_put {nbytes / t / 1e9:.1f} GB/s", flush=True)
            for mode in (0, 1, 2):
                for bm, bn in ((32, 256), (64, 256), (128, 128), (128, 256)):
                    for stages in (2, 3, 4):
                        if bm * bn * 2 * stages > 200 * 1024:
                            continue
                        for per_sm in (1, 2, 4):
                            grid = (sms * per_sm,)
                            try:
                                t = timed(lambda: tma_copy[grid](src, dst, M, 0, 1, hb, N=N, BM=bm, BN=bn,
                                                                 STAGES=stages, MODE=mode, num_warps=4))
                            except Exception as exc:
                                print(f"mode {mode} {bm}x{bn} s{stages} g{per_sm}: FAILED {type(exc).__name__}: "
                                      f"{str(exc)[:300]}", flush=True)
                                continue
                            print(f"{size_mib}MiB tma mode={mode} {bm}x{bn} stages={stages} per_sm={per_sm} "
                                  f"{nbytes / t / 1e9:.1f} GB/s", flush=True)
            dst.zero_()
            ctx.barrier()
            tma_copy[(sms,)](src, dst, M, 0, 1, hb, N=N, BM=64, BN=256, STAGES=3, MODE=0, num_warps=4)
            torch.cuda.synchronize()
        else:
            ctx.barrier()
        ctx.barrier()
        ref = ctx.broadcast(src.cpu() if rank == 0 else None, 0)
        if rank == 1:
            ok = torch.equal(dst.cpu(), torch.as_tensor(ref))
            print(f"{size_mib}MiB rank1 dst matches rank0 src after TMA put: {ok}", flush=True)
        ctx.barrier()
    ctx.close()


if __name__ == "__main__":
    main()
