"""Probe: where the host's time of a repeated small all_reduce goes, piece by piece.

    python -m iris run -n 2 benchmarks/probes/host_path_probe.py      (GPUs, one rank each)

A repeated ``ctx.ccl.all_reduce(out, x)`` with the same tensors is host-bound at 1-64 KiB (issue 21): its
GPU work replayed from a CUDA graph takes 3.6-5 us on 2 x H100, the host 6-10 us per call. This times, on
rank 0, the host microseconds per call of the whole call and of each piece of its path on its own:

    whole call          ctx.ccl.all_reduce(out, x), the remembered plan's graph launched by the driver
    graph launch        that plan's launcher alone (cuGraphLaunch through ctypes)
    call key            iris.host.replay.call_key of the call's arguments
    key lookup          the remembered plans' dict lookup of that key
    capture check       whether the current stream is being captured (the check the replay makes)
    current stream      the raw handle of the current stream (each graph launch asks for it)

Every piece runs in batches of --calls back-to-back calls, --batches of them; each figure is the median
batch (and the least). The launching pieces run on every rank alike (each all_reduce needs its peers).
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
from _results import host_us_batches  # noqa: E402

from iris.ccl import Config  # noqa: E402
from iris.host.replay.plans import _current_stream, call_key, value_key  # noqa: E402


def main() -> int:
    args, ctx = _probe.start(__doc__, "the CPU backend has no graph launch to time", calls=200, batches=15)
    rank, device = ctx.get_rank(), torch.cuda.current_device()
    if rank == 0:
        print("torch", torch.__version__, torch.cuda.get_device_name(), "ranks", ctx.get_num_ranks())
    for nbytes in args.bytes:
        x = ctx.ones(nbytes // 2, dtype=torch.bfloat16)
        out = ctx.zeros(nbytes // 2, dtype=torch.bfloat16)
        whole = lambda: ctx.ccl.all_reduce(out, x)  # noqa: E731
        for _ in range(3):  # the first call plans, the second captures the graph
            whole()
        torch.cuda.synchronize()
        plans = ctx.ccl._plans
        key, plan = list(plans._plans.items())[-1]  # this call's key, as ctx.ccl made it, and its plan
        if plan.launch_graph is None:
            raise SystemExit("the call was not replayed from a graph (IRIS_GRAPH_REPLAY=0?)")
        pieces = {
            "whole call": whole,
            "graph launch": plan.launch_graph,
            "call key": lambda: call_key("all_reduce", out, x, None, None, False, value_key(None, Config), None,
                                         ctx.tracing.enabled),
            "key lookup": lambda: plans._plans.get(key),
            "capture check": plans._capturing,
            "current stream": lambda: _current_stream(device),
        }
        for name, call in pieces.items():
            ctx.barrier()
            median, least = host_us_batches(call, args.calls, args.batches)
            if rank == 0:
                print(f"{nbytes:>8} B  {name:<16} host {median:6.2f} us per call (least {least:6.2f})", flush=True)
        ctx.barrier()
    ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
