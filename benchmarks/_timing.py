"""One way to time a call, the same for every implementation a table compares (Iris, NCCL, NCCL symmetric, torch
symmetric memory): three methods, each a column value of the CSVs (``method``).

    device  the GPU's time per call: CUDA events around ``calls`` calls launched back to back on one stream,
            divided by ``calls`` (nccl-tests' method: its default of 20 calls an event pair; algbw and busbw
            come from this figure)
    eager   host-inclusive time per call: the wall clock around ``calls`` calls issued back to back, the GPU
            waited for once at the end (what a program that calls the collective in a loop sees)
    graph   the GPU's time per call replayed from a CUDA graph: ``calls`` calls captured once, one replay
            between CUDA events, divided by ``calls`` (how an inference engine runs small collectives)

Every sample of every method starts the same way: the GPU idle (synchronized), then ``meet`` (the ranks meet:
``ctx.barrier``, a host barrier, as nccl-tests' barrier before its timed loop), then the sample. Every
implementation gets the same warm-up calls before its first sample, and the samples are taken in turns
(sample i of each implementation before sample i + 1 of any), so that a spell of host or GPU noise falls on
all of them alike. The figure is the median over ``samples`` samples.

On the CPU backend (Triton's interpreter, no CUDA) only ``eager`` exists: a smoke test, not a figure.

Example:
    >>> timer = Timer(gpu=True, meet=ctx.barrier)
    >>> timer.per_call_us({"iris": iris_call, "nccl": nccl_call}, "device")
    {'iris': 5.1, 'nccl': 7.4}
"""

import dataclasses
import os
import statistics
import time
from typing import Callable

import torch

METHODS = ("device", "eager", "graph")
CALLS_PER_SAMPLE = 20  # nccl-tests' default (-n 20)
# A small message's device figure more than this many times its graph-replay figure: the device method then
# times something else than the call (launch gaps, a late peer), and the run is flagged (suspect_rows).
SUSPECT_RATIO, SUSPECT_MAX_BYTES = 2.0, 64 << 10


def nothing() -> None:
    """No ranks to meet (one process)."""


@dataclasses.dataclass
class Timer:
    """Times calls by one of :data:`METHODS` (see the module's docstring).

    Args:
        gpu: CUDA events and synchronization (False: the CPU backend, ``eager`` only, by ``clock``).
        calls: calls per sample (20, nccl-tests' default).
        samples: samples per figure (the median is the figure).
        warmup: untimed calls of each implementation before its first sample (compiles, binds).
        meet: how the ranks meet before each sample, outside its time (``ctx.barrier``); every rank must
            take the same samples in the same order, or a collective hangs.
        clock: the host clock of the ``eager`` method.
    """

    gpu: bool
    calls: int = CALLS_PER_SAMPLE
    samples: int = 20
    warmup: int = 5
    meet: Callable[[], None] = nothing
    clock: Callable[[], float] = time.perf_counter

    def __post_init__(self):
        if self.calls < 1 or self.samples < 1 or self.warmup < 0:
            raise ValueError(f"need calls >= 1, samples >= 1, warmup >= 0; got {self.calls}, {self.samples}, "
                             f"{self.warmup}")

    def methods(self) -> tuple[str, ...]:
        """The methods this timer can take: all three on a GPU, ``eager`` on the CPU backend."""
        return METHODS if self.gpu else ("eager",)

    def per_call_us(self, impls: dict[str, Callable[[], object]], method: str) -> dict[str, float | str]:
        """label -> median microseconds per call of each of ``impls`` by ``method``, or (graph) why its capture
        failed. Each implementation first gets ``warmup`` calls."""
        if method not in self.methods():
            raise ValueError(f"method {method!r}: this timer takes {', '.join(self.methods())}")
        for fn in impls.values():
            for _ in range(self.warmup):
                fn()
        self._idle()
        take = {"device": self._device_sample, "eager": self._eager_sample, "graph": self._graph_sample}[method]
        runnable, figures = dict(impls), {}
        if method == "graph":
            runnable, figures = self._captured(impls)
        taken = {label: [] for label in runnable}
        for _ in range(self.samples):
            for label, fn in runnable.items():
                self._idle()
                self.meet()
                taken[label].append(take(fn))
        self._idle()
        for label, samples in taken.items():
            figures[label] = statistics.median(sample() if callable(sample) else sample for sample in samples)
        return {label: figures[label] for label in impls}

    def _idle(self) -> None:
        if self.gpu:
            torch.cuda.synchronize()

    def _device_sample(self, fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(self.calls):
            fn()
        end.record()
        return lambda: start.elapsed_time(end) * 1e3 / self.calls  # read once the GPU is done

    def _eager_sample(self, fn) -> float:
        start = self.clock()
        for _ in range(self.calls):
            fn()
        self._idle()
        return (self.clock() - start) * 1e6 / self.calls

    def _graph_sample(self, graph):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        return lambda: start.elapsed_time(end) * 1e3 / self.calls

    def _captured(self, impls: dict) -> tuple[dict, dict]:
        """(label -> CUDA graph of ``calls`` calls, label -> why one could not be captured). Every rank captures
        the same implementations: a capture that fails on one rank must fail on all (the same code)."""
        graphs, why = {}, {}
        for label, fn in impls.items():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph, stream=stream):
                    for _ in range(self.calls):
                        fn()
            except Exception as exc:  # a call torch cannot capture: the row says why
                why[label] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
                continue
            finally:
                torch.cuda.current_stream().wait_stream(stream)
            graphs[label] = graph
        return graphs, why


def suspect(device_us, graph_us, nbytes: int) -> bool:
    """Whether a small message's device figure is more than :data:`SUSPECT_RATIO` times its graph-replay figure
    (both times of one implementation at one point): the device method then times launch gaps or a late peer,
    not the call, and the figure needs a profile before anyone quotes it.

    Example:
        >>> suspect(63.0, 6.6, 1024), suspect(7.0, 6.6, 1024), suspect(63.0, 6.6, 1 << 20)
        (True, False, False)
    """
    if nbytes > SUSPECT_MAX_BYTES or not isinstance(device_us, float) or not isinstance(graph_us, float):
        return False
    return device_us > SUSPECT_RATIO * graph_us


def nccl_facts() -> dict:
    """The CSV's NCCL columns: the version torch was built with and the protocol and algorithm NCCL was told to
    use (NCCL_PROTO, NCCL_ALGO; "default": NCCL's own choice per size)."""
    try:
        version = ".".join(str(part) for part in torch.cuda.nccl.version()) if torch.cuda.is_available() else ""
    except (AttributeError, RuntimeError):
        version = ""
    return {"nccl_version": version, "nccl_proto": os.environ.get("NCCL_PROTO", "default"),
            "nccl_algo": os.environ.get("NCCL_ALGO", "default")}


def by_methods(timer: Timer, methods, impls: dict, share=lambda figures: figures,
               nccl_captures: bool = True) -> dict[str, dict[str, float | str]]:
    """method -> label -> median microseconds per call (or why it was not timed) of each of ``impls`` by each of
    ``methods``. ``share``: makes every rank take rank 0's figures (``lambda f: ctx.broadcast(f, src=0)``).
    ``nccl_captures``: False where the process group cannot be captured in a CUDA graph (gloo: the CPU backend,
    simulation): the graph method then leaves out the labels starting with "nccl" (a failed capture would leave
    torch's allocator mid-capture until exit), and says so.

    Example:
        >>> by_methods(timer, ("device", "graph"), {"iris": f, "nccl": g}, share, nccl_captures=False)["graph"]
        {'iris': 3.1, 'nccl': 'the process group (gloo) cannot be captured in a CUDA graph'}
    """
    figures = {}
    for method in methods:
        timed = impls
        if method == "graph" and not nccl_captures:
            timed = {label: fn for label, fn in impls.items() if not label.startswith("nccl")}
        timer.meet()
        found = share(timer.per_call_us(timed, method))
        figures[method] = {label: found.get(label, "the process group (gloo) cannot be captured in a CUDA graph")
                           for label in impls}
    return figures


def add_timing_arguments(parser, gpu: bool, methods=METHODS) -> None:
    """``--methods`` (default ``methods`` on a GPU, eager on the CPU backend), ``--calls``, ``--iters`` (samples)
    and ``--warmup``, the same in every benchmark; check them after parsing with :func:`check_timing_arguments`.

    Example:
        >>> add_timing_arguments(parser, gpu, methods=("graph",))   # tp_decode.py: decode steps replay a graph
    """
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(methods if gpu else ("eager",)),
                        help=f"how to time (benchmarks/_timing.py): {', '.join(methods)} on a GPU; eager only on "
                             "the CPU backend")
    parser.add_argument("--calls", type=int, default=CALLS_PER_SAMPLE if gpu else 1,
                        help=f"calls per sample ({CALLS_PER_SAMPLE}, nccl-tests' default; 1 on the CPU backend)")
    parser.add_argument("--iters", type=int, default=20 if gpu else 2, help="timed samples per point (the median)")
    parser.add_argument("--warmup", type=int, default=5 if gpu else 1, help="untimed calls of each first")


def check_timing_arguments(parser, args, gpu: bool) -> None:
    """Refuse, before any timing, a method the backend lacks or counts out of range (``parser.error``)."""
    if not gpu and set(args.methods) - {"eager"}:
        parser.error("--methods: the CPU backend has no CUDA events or graphs; only eager runs there")
    if args.calls < 1 or args.iters < 1 or args.warmup < 0:
        parser.error(f"need --calls >= 1, --iters >= 1, --warmup >= 0; got {args.calls}, {args.iters}, "
                     f"{args.warmup}")
