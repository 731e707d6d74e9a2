"""Probe: how long does a small all_reduce take a call when called eagerly back to back, Iris's and NCCL's?

    python -m iris run -n 2 benchmarks/probes/nccl_eager_probe.py          (2 NVIDIA GPUs)

For 1 KiB and 64 KiB of bf16 per rank, rank 0 prints, for ``ctx.ccl.all_reduce`` and for
``torch.distributed.all_reduce`` (NCCL) issued 1, 20 and 2000 times in a row after a synchronize and a host
barrier: the host's time per call to launch them all, the GPU's (CUDA events around the batch) and the
host's time until the last one is done. Where the host launches faster than the GPU's time per call, the
GPU's figure is the call's own cost back to back. Then it profiles 3000 Iris calls (cProfile) and writes
the top of it by own time to $OUT/prof_<bytes>.txt ($OUT: a folder, the current one when unset).
"""

import os

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import cProfile  # noqa: E402
import io  # noqa: E402
import pstats  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import iris  # noqa: E402

ctx = iris.iris(1 << 30)
rank = ctx.get_rank()
out_dir = os.environ.get("OUT", ".")
for nbytes in (1024, 65536):
    n = nbytes // 2
    x = ctx.ones(n, dtype=torch.bfloat16)
    y = ctx.zeros(n, dtype=torch.bfloat16)
    t = torch.ones(n, dtype=torch.bfloat16, device=x.device)
    for name, fn in (("iris", lambda: ctx.ccl.all_reduce(y, x)), ("nccl", lambda: dist.all_reduce(t))):
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        ctx.barrier()
        for calls in (1, 20, 2000):
            torch.cuda.synchronize()
            ctx.barrier()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            h0 = time.perf_counter()
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            h1 = time.perf_counter()
            end.synchronize()
            h2 = time.perf_counter()
            if rank == 0:
                print(f"{name} {nbytes} B x{calls}: host launch {1e6 * (h1 - h0) / calls:.2f} us/call, "
                      f"GPU {1e3 * start.elapsed_time(end) / calls:.2f} us/call, host to done "
                      f"{1e6 * (h2 - h0) / calls:.2f} us/call", flush=True)
    torch.cuda.synchronize()
    ctx.barrier()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(3000):
        ctx.ccl.all_reduce(y, x)
    profile.disable()
    torch.cuda.synchronize()
    ctx.barrier()
    if rank == 0:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
        with open(os.path.join(out_dir, f"prof_{nbytes}.txt"), "w") as f:
            f.write(text.getvalue())
ctx.barrier()
ctx.close()
