"""Probe: what an eager small all_reduce's time per call is made of, host against GPU.

    python -m iris run -n 2 benchmarks/probes/eager_probe.py [--bytes 4096 65536] [--iters 30]

ccl.py's eager figure of a repeated ``ctx.ccl.all_reduce(out, x)`` (issue 21) is at least the slower rank's host
time per call and at least the GPU's; this times, for the default variant, per call (microseconds, rank 0,
median of --iters samples, every rank timing alike):

    eager, 200 us samples     as ccl.py: batches of about 200 us after a device barrier
    eager, 2000 us samples    the same with batches ten times longer (the batch's start spread thinner)
    eager, 20 us lead         200 us batches whose clock starts after the GPU has spun 20 us: the host's
                              first few launches of the batch are out of the figure (how much of the
                              200 us batches' surplus over 2000 us ones is the batch's start)
    eager, no barrier         200 us batches without the device barrier before each (ccl.py --unaligned)
    queued                    the same 200 us batches, but the GPU spins 1 ms before each batch's clock
                              starts, so every call of the batch is launched before the GPU reaches it:
                              the GPU's time per separately launched call (graph launches, or with
                              IRIS_GRAPH_REPLAY=0 the kernel launches), the host out of the figure
    graph batch               the batch captured into one CUDA graph and replayed (ccl.py's +graph rows)
    host                      the host's time per call issued back to back (the slowest rank's)

Run it with IRIS_NATIVE_REPLAY and IRIS_GRAPH_REPLAY set as wanted; the first lines say which.
"""

import os

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                      ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results, ccl

import _probe  # noqa: E402
import torch  # noqa: E402
from _results import graph_median_us, host_us, interleaved_median_us  # noqa: E402

from iris import config  # noqa: E402

QUEUE_LEAD_US = 1000.0


def main() -> int:
    args, ctx = _probe.start(__doc__, "the CPU backend launches nothing to time", iters=30, warmup=5)
    rank = ctx.get_rank()
    if rank == 0:
        print("torch", torch.__version__, torch.cuda.get_device_name(), "ranks", ctx.get_num_ranks(),
              "IRIS_GRAPH_REPLAY", config.graph_replay(), "IRIS_NATIVE_REPLAY", config.native_replay(), flush=True)
    agree = lambda batch: ctx.broadcast(batch, src=0)  # noqa: E731
    for nbytes in args.bytes:
        x = ctx.ones(nbytes // 2, dtype=torch.bfloat16)
        out = ctx.zeros(nbytes // 2, dtype=torch.bfloat16)
        call = lambda: ctx.ccl.all_reduce(out, x)  # noqa: E731
        eager = {
            "eager, 200 us samples": dict(sample_us=200.0),
            "eager, 2000 us samples": dict(sample_us=2000.0),
            "eager, 20 us lead": dict(sample_us=200.0, lead_us=20.0),
            "eager, no barrier": dict(sample_us=200.0, before_each=None),
            "queued": dict(sample_us=200.0, lead_us=QUEUE_LEAD_US),
        }
        figures = {}
        for name, how in eager.items():
            ctx.barrier()
            how = {"before_each": ctx.device_barrier, **how}
            figures[name] = interleaved_median_us({name: call}, args.warmup, args.iters, True, agree=agree,
                                                  **how)[name]
        ctx.barrier()
        figures["graph batch"] = graph_median_us(call, args.warmup, args.iters, 200.0, agree=agree)
        ctx.barrier()
        host = min(host_us(call) for _ in range(5))
        figures["host (slowest rank)"] = max(ctx.broadcast(host, src=r) for r in range(ctx.get_num_ranks()))
        for name, us in figures.items():
            us = ctx.broadcast(us, src=0)
            if rank == 0:
                print(f"{nbytes:>8} B  {name:<24} {us:7.2f} us per call", flush=True)
    ctx.barrier()
    ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
