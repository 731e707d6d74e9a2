"""The GPU's own timeline of a call, from torch.profiler (CUPTI): every kernel and copy, when, on which stream.

Iris's tracing (iris.tracing) sees the spans Iris's kernels record; where a fused op hands work to the vendor's
GEMM or to the copy engine (all_gather_matmul's default at bf16), those spans are not there. This sees every
kernel, copy and memset the GPU ran, whoever launched it, and says where a call's time went between them.

Example (GPU; ``before`` starts the call as a timed sample does, the lead spin last; all_gather_matmul at
M 128 N 14336 K 8192 on 2 x H200, docs/benchmarks.md):
    >>> acts = call_timeline(p.fused, before=lambda: (ctx.device_barrier(), torch.cuda._sleep(10**6)))
    >>> span_us(acts), busy_us(acts)
    (71.7, 70.2)
"""

import json
import os
import tempfile

import torch

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LEAD_KERNEL = "spin_kernel"  # torch.cuda._sleep's kernel: the call's activities are those after the last one


def activities(trace_events: list[dict], after: str = LEAD_KERNEL) -> list[tuple[str, int, float, float]]:
    """The GPU activities of a Chrome trace's events (torch.profiler's export) that start after the last one whose
    name holds ``after`` (none: all of them): (name, stream, start, length) in microseconds, the start counted
    from the first activity's, in order of start."""
    gpu = sorted((e for e in trace_events if e.get("cat") in GPU_CATEGORIES), key=lambda e: e["ts"])
    leads = [e for e in gpu if after in e["name"]]
    if leads:
        gpu = [e for e in gpu if e["ts"] >= leads[-1]["ts"] + leads[-1]["dur"] and after not in e["name"]]
    if not gpu:
        return []
    first = gpu[0]["ts"]
    return [(e["name"], int(e.get("args", {}).get("stream", e.get("tid", -1))), e["ts"] - first, e["dur"])
            for e in gpu]


def span_us(acts) -> float:
    """From the first activity's start to the last one's end."""
    return max((start + length for _, _, start, length in acts), default=0.0)


def busy_us(acts) -> float:
    """The time at least one activity ran (the union of their intervals): span_us less the GPU's idle gaps."""
    busy, reach = 0.0, 0.0
    for _, _, start, length in sorted(acts, key=lambda a: a[2]):
        end = start + length
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    return busy


def call_timeline(fn, before) -> list[tuple[str, int, float, float]]:
    """The activities (see :func:`activities`) of one call of ``fn``, profiled after ``before()``, whose last
    launch must be torch.cuda._sleep's (the host's head start: the call's launches queue behind it)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        before()
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            return activities(json.load(f)["traceEvents"])


def describe(acts, width: int = 70) -> list[str]:
    """One line per activity: start, length, stream, the name cut to ``width`` characters."""
    return [f"+{start:8.1f} {length:8.1f}  stream {stream:<3} {name[:width]}" for name, stream, start, length in acts]
