"""Probe: the host's time to launch one small kernel, five ways, on one GPU.

    python benchmarks/probes/graph_launch_probe.py          (one NVIDIA GPU; PYTHONPATH=. from the repo root)

A repeated ``ctx.ccl`` / ``ctx.ops`` call replays its launches from a CUDA graph
(iris.host.replay.Plans), so on small collectives the host's cost of that graph launch is most of
the call (issue 21's eager figures). This times, on the same empty Triton kernel:

    kernel[grid]        Triton's own launch (binds and specializes the arguments on every call)
    bound launch        iris.host.replay.bind's launch (the compiled kernel, arguments fixed)
    graph.replay()      torch.cuda.CUDAGraph.replay() of a graph holding that one launch
    cuGraphLaunch       the driver's cuGraphLaunch of the same graph through ctypes
                        (iris.host.replay.graph_launcher, what a remembered call uses)
    cuLaunchKernel      the driver's cuLaunchKernel of the compiled kernel, its arguments packed once, through
                        ctypes (iris.host.replay.direct, what IRIS_DIRECT_LAUNCH=1 relaunches a one-kernel call by)

Each figure: median and least of 7 batches of 5000 back-to-back calls, host time per call (the empty
kernel's GPU time is below the launch rate); then the stream's time per call of the bound launch, the
graph launch and the packed launch, from events (the GPU's cost of each way, one after another).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: _results, ccl

import torch
import triton
from _results import host_us_batches

from iris.host.replay import bind, captured_graph, graph_launcher
from iris.host.replay.direct import direct_launcher


@triton.jit
def _empty(x):
    pass


def stream_us(call, calls=2000) -> float:
    """The stream's microseconds per call over ``calls`` back-to-back calls."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) * 1000 / calls


def main() -> None:
    x = torch.zeros(16, device="cuda")
    bound = bind(_empty, (1,), x)
    bound()
    graph = captured_graph([bound])
    launch_graph = graph_launcher(graph, torch.cuda.current_device())
    driver = getattr(launch_graph, "__self__", None) is not graph
    direct = direct_launcher(bound)
    print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    if direct is None:
        print("cuLaunchKernel: not available here (no cuFuncGetParamInfo, or the launch is not a plain one)")
    ways = [("kernel[grid]", lambda: _empty[(1,)](x)), ("bound launch", bound), ("graph.replay()", graph.replay),
            ("cuGraphLaunch" if driver else "graph_launcher (replay)", launch_graph)]
    ways += [("cuLaunchKernel (packed)", direct)] if direct is not None else []
    for name, call in ways:
        print(f"{name:<24} host {'%.2f / %.2f' % host_us_batches(call, 5000, 7)} us per call (median / least)")
    for name, call in ways[1:]:
        print(f"{name:<24} stream {stream_us(call):.2f} us per call")


if __name__ == "__main__":
    main()
