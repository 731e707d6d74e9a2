"""What the benchmarks share: sizes on the command line, median timing, the commit, a tidy CSV under results/.

A run writes benchmarks/results/<benchmark>_<gpu-kind>_<N>ranks.csv (and its PNG) by default, replacing the
canonical run there; an A/B arm or a tagged run goes where ``--csv`` names, outside results/ (see
:func:`add_csv_argument`; benchmarks/summarize_results.py writes the folder's README table).
"""

import argparse
import csv
import math
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import torch
from summarize_results import RESULTS, canonical_name, parse_name

# GPU clock cycles per microsecond at the highest clocks of the GPUs we time on (an H200 boosts to 1980
# MHz): a spin of lead_us * this lasts at least lead_us.
SPIN_CYCLES_PER_US = 2000


def git_commit() -> str:
    """The commit the results belong to.

    IRIS_COMMIT when set (a copy of a working tree whose .git is stale or absent, as on the GPU
    machines: ``IRIS_COMMIT=$(git rev-parse --short HEAD)`` where the tree came from); otherwise
    the checkout's short commit, with "-dirty" when files differ from it; "unknown" without git.
    """
    if os.environ.get("IRIS_COMMIT"):
        return os.environ["IRIS_COMMIT"]
    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"],
                             cwd=Path(__file__).resolve().parent, capture_output=True, text=True, timeout=10,
                             check=False)
        return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def default_csv(family: str, gpu_name: str, world: int) -> Path:
    """benchmarks/results/<family>_<gpu>_<world>ranks.csv, e.g. ccl_nvidia-h200_2ranks.csv: the canonical run."""
    return RESULTS / canonical_name(family, gpu_name, world)


def add_csv_argument(parser: argparse.ArgumentParser, family: str) -> None:
    """``--csv PATH`` (default: the canonical benchmarks/results/<family>_<gpu>_<W>ranks.csv, which a run
    replaces) and ``--force-csv``; check the choice with :func:`check_csv_argument` after parsing."""
    parser.add_argument("--csv", type=Path, default=None,
                        help=f"CSV path; the PNG goes beside it (default benchmarks/results/{family}_<gpu>_<W>ranks"
                             ".csv, the canonical run, replaced). An A/B arm or tagged run: a path outside "
                             "benchmarks/results/")
    parser.add_argument("--force-csv", action="store_true",
                        help="write --csv even where it names another file than a canonical one in "
                             "benchmarks/results/")


def check_csv_argument(parser: argparse.ArgumentParser, args: argparse.Namespace, family: str) -> None:
    """Refuse a ``--csv`` under benchmarks/results/ whose name is not ``<family>_<gpu>_<W>ranks.csv`` (unless
    ``--force-csv``): that folder keeps one run per benchmark, GPU kind and world size (tests/test_results.py)."""
    if args.csv is None or args.force_csv or args.csv.resolve().parent != RESULTS:
        return
    parsed = parse_name(args.csv.name)
    if parsed is None or parsed[0] != family or parsed[3] != ".csv":
        parser.error(f"--csv {args.csv}: benchmarks/results/ keeps only the canonical runs "
                     f"({family}_<gpu-kind>_<N>ranks.csv, the default); put an A/B arm or tagged run elsewhere, "
                     "e.g. --csv /tmp/{family}_try.csv, or insist with --force-csv".replace("{family}", family))


TEXT_COLUMNS = ("gpu", "backend", "version", "commit")  # a commit such as 1e10567 is no number


def read_csv(path: Path) -> list[dict]:
    """A results CSV's rows with numbers as numbers (what the benchmarks' plots take), e.g. to redraw a PNG."""
    def value(key: str, text: str):
        if key in TEXT_COLUMNS:
            return text
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    with open(path, newline="") as f:
        return [{key: value(key, text) for key, text in row.items()} for row in csv.DictReader(f)]


def run_facts(ctx, iters: int, **extra) -> dict:
    """The columns every row of a run starts with: GPU (or "cpu"), backend, world size, Iris's version, the commit,
    the samples per point, then ``extra`` in its order.

    Example:
        >>> base = run_facts(ctx, args.iters, dtype="bf16")
    """
    import iris

    gpu = ctx.backend.name != "cpu"
    return {"gpu": torch.cuda.get_device_name(ctx.get_device()) if gpu else "cpu", "backend": ctx.backend.name,
            "world_size": ctx.get_num_ranks(), "version": iris.__version__, "commit": git_commit(), "iters": iters,
            **extra}


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"CSV: {path}")


def plot_ways(rows: list[dict], panel_keys: tuple, x_key: str, path: Path, title: str) -> None:
    """A PNG beside a results CSV: one panel per value of ``panel_keys``, ``x_key`` on a log2 axis, one line per
    way (``impl``) of its median ``us``. Skipped, with a line saying so, where matplotlib is not installed.

    Example:
        >>> plot_ways(rows, ("hidden",), "tokens", Path("results/rmsnorm_nvidia-h200_2ranks.png"), "rmsnorm")
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib)")
        return
    panels = list(dict.fromkeys(tuple(r[k] for k in panel_keys) for r in rows))
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for panel, ax in zip(panels, axes[0]):
        mine = [r for r in rows if tuple(r[k] for k in panel_keys) == panel and r["us"] not in ("", None)]
        for way in dict.fromkeys(r["impl"] for r in mine):
            line = sorted((r for r in mine if r["impl"] == way), key=lambda r: r[x_key])
            ax.plot([r[x_key] for r in line], [r["us"] for r in line], marker="o", label=way)
        ax.set_xscale("log", base=2)
        ax.set_xlabel(x_key)
        ax.set_ylabel("median us")
        ax.set_title(", ".join(f"{k} {v}" for k, v in zip(panel_keys, panel)))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    commits = ", ".join(dict.fromkeys(str(r["commit"]) for r in rows))
    fig.suptitle(f"{title}: {rows[0]['gpu']}, commit {commits}")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"PNG: {path}")


def parse_size(text: str) -> int:
    match = re.fullmatch(r"(\d+)\s*([KMG]?)(?:i?B)?", text.strip(), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: use a number with K, M or G (KiB, MiB, GiB), e.g. 64K or 256M")
    return int(match[1]) << {"K": 10, "M": 20, "G": 30, "": 20}[match[2].upper()]


def median_us(fn, warmup: int, iters: int, gpu: bool, sample_us: float = 50.0, agree=None) -> float:
    """Median microseconds per call of ``fn``, over ``iters`` samples after ``warmup`` untimed calls.

    On a GPU a sample is a batch of calls launched back to back from the host between two CUDA
    events, as nccl-tests times (the per-call figure is the batch's time over its size). The batch
    holds enough calls to last about ``sample_us`` (1 for calls longer than that), so a small
    call's figure is its cost in a stream of calls, not one event pair's overhead.

    ``agree``: for a collective ``fn``, a function that makes every rank use the same batch size
    (say ``lambda b: ctx.broadcast(b, src=0)``); ranks calling a collective a different number of
    times would hang.
    """
    return interleaved_median_us({"": fn}, warmup, iters, gpu, sample_us, agree)[""]


def interleaved_median_us(calls: dict, warmup: int, iters: int, gpu: bool, sample_us: float = 50.0, agree=None,
                          before_each=None, settle_ms: float = 0.0, lead_us: float = 0.0,
                          clock=time.perf_counter, calls_per_sample: dict | None = None) -> dict:
    """:func:`median_us` of each of ``calls`` (label -> function), with the samples taken in turns:
    sample i of every call before sample i + 1 of any. Figures that one table compares (a fused op,
    its GEMM alone, its communication alone) then see the same clocks: a GPU held at its power limit
    by GEMMs runs at lower clocks the longer it has been busy (an H200 at 1665-1845 MHz and 680-692 W
    under back-to-back 4096 x 8192 x 8192 GEMMs, 1980 MHz when fresh), and figures timed one after
    the other would credit the first with the fresh GPU.

    ``before_each``: called before each sample, outside its time: ``ctx.device_barrier``, so that the
    ranks start each collective's sample together. Not a host barrier (``ctx.barrier``): waiting for
    the GPU before each sample leaves it idle until the sample's first launch, and the sample then
    times the host's launch path as well (iris.ops.matmul's autotuned launch at 1024 x 8192 x 8192
    on an H200: 338 us against 186). ``settle_ms``: after the warmup calls, the calls go on in turns,
    untimed, for about this long, so that every shape is timed on a GPU under sustained load, not
    one shape on a GPU that had just sat idle while kernels compiled and the next on a busy one
    (cuBLAS at 1024 x 8192 x 8192 on an H200: 170.0 us unsettled, 192.7 and 196.6 us settled, in one
    session). ``lead_us`` (GPU): before each sample's start event, the GPU spins this long
    (``torch.cuda._sleep``), so that the host has launched the sample's calls before its clock
    starts. Without it a sample that follows one whose host path outlasts its GPU time (a
    collective of little data, host-bound) starts on an idle GPU and times its own launch path too:
    a fused op whose kernel took 175.3 us (torch.profiler) measured 214.3 us after iris.ccl.all_gather
    at one rank. ``clock``: the host clock (the CPU path's samples, and the settling time).
    ``calls_per_sample``: a dict that gets each label's calls per sample (GPU; :func:`batch_size`).

    Example:
        >>> interleaved_median_us({"fused": p.fused, "cublas": p.gemm_torch}, 3, 20, gpu=True)
        {'fused': 812.4, 'cublas': 771.0}
    """
    for fn in calls.values():  # first calls compile and bind: not part of any figure
        for _ in range(warmup):
            fn()
    if settle_ms > 0:
        _settle(calls, settle_ms, gpu, agree, before_each, clock)
    samples = {label: [] for label in calls}
    if not gpu:  # the interpreter runs a launch to completion before returning
        for _ in range(iters):
            for label, fn in calls.items():
                if before_each is not None:
                    before_each()
                start = clock()
                fn()
                samples[label].append((clock() - start) * 1e6)
        return {label: statistics.median(times) for label, times in samples.items()}
    batches = {label: batch_size(sample_us, agree, _gpu_us_per_call(fn, before_each, lead_us))
               for label, fn in calls.items()}
    if calls_per_sample is not None:
        calls_per_sample.update(batches)
    for _ in range(iters):
        for label, fn in calls.items():
            samples[label].append(_sample(fn, batches[label], before_each, lead_us))
    torch.cuda.synchronize()
    return {label: statistics.median([start.elapsed_time(end) * 1e3 / batches[label] for start, end in events])
            for label, events in samples.items()}


def _settle(calls: dict, settle_ms: float, gpu: bool, agree, before_each, clock) -> None:
    """Run ``calls`` in turns, untimed, for about ``settle_ms`` (the same number of rounds on every rank)."""
    def one_round():
        for fn in calls.values():
            if before_each is not None:
                before_each()
            fn()

    wait = torch.cuda.synchronize if gpu else (lambda: None)
    wait()
    start = clock()
    one_round()
    wait()
    rounds = max(0, min(1000, math.ceil(settle_ms / max((clock() - start) * 1e3, 1e-3)) - 1))
    for _ in range(rounds if agree is None else int(agree(rounds))):
        one_round()


def _sample(fn, calls: int, before_each, lead_us: float):
    """The (start, end) CUDA events around ``calls`` calls of ``fn`` launched back to back, taken as every
    sample is (see :func:`interleaved_median_us`: ``before_each`` and the GPU's lead outside its time)."""
    if before_each is not None:
        before_each()
    if lead_us:
        torch.cuda._sleep(int(lead_us * SPIN_CYCLES_PER_US))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    return start, end


def _gpu_us_per_call(fn, before_each=None, lead_us: float = 0.0):
    """``time_batch(n)`` for :func:`batch_size`: the GPU's microseconds per call of a sample of ``n`` calls."""
    def time_batch(calls: int) -> float:
        start, end = _sample(fn, calls, before_each, lead_us)
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls
    return time_batch


SHORT_PILOT, LONG_PILOT = 3, 23  # calls: the batch comes from the difference their times make
# A sample lasts at least START_SHARE times what starting it costs (up to MAX_CALLS calls): a call whose samples
# start late (NCCL's eager all_reduce through torch.distributed on 2 x H200: 5-7 calls a sample, 8-78 us a call
# from one size to the next in one run) has its start spread over enough calls to be a tenth of its figure.
START_SHARE, MAX_CALLS = 10, 400


def batch_size(sample_us: float, agree, time_batch) -> int:
    """Calls of a sample: enough to last about ``sample_us`` back to back (1 to 100), the same on every rank.

    ``time_batch(n)`` times ``n`` calls as a sample is taken (after ``before_each``, the GPU's lead) and returns
    microseconds per call. A sample's time is what starting it costs (the first launches on an idle GPU, a
    peer's first launch) plus its calls; pilots of 3 calls and of 23, each taken twice (the lesser time of
    each kept: a spell only adds), give the cost of a call as the difference 20 calls make, which no start
    cost enters. A pilot's own time per call (at most the call's cost plus its start's share) bounds it
    from above, and a quarter of that from below (where both short pilots fell in a spell). Calls whose short
    pilot takes more than 4 samples' time per call take no long pilot (one call a sample). The batch also
    holds enough calls for the start (the short pilot's time beyond its calls) to be at most 1 / START_SHARE
    of the sample, up to MAX_CALLS.

    At 8df51a0 the least time per call of three pilots sized the batch: on 2 x H200 each sample of a 6 us
    all_reduce then got 10-28 calls, NCCL's 2 (a 100 us start in its figures). Before it, one 3-call pilot
    right after the host's broadcast of the last batch size (which a peer leaves up to 0.5 ms after rank 0)
    gave the all_reduce 4-12 and NCCL 1-2. ``agree`` (e.g. ``lambda b: ctx.broadcast(b, src=0)``) makes every rank take
    rank 0's choices: ranks calling a collective a different number of times would hang. ``sample_us`` 0:
    one call a sample, no pilot.

    Example:
        >>> batch_size(200.0, None, lambda n: 5.0 + 10.0 / n)   # 5 us calls, samples that start 10 us late
        40
        >>> batch_size(200.0, None, lambda n: 30.0 + 100.0 / n)  # 30 us calls, samples that start 100 us late
        34
    """
    if sample_us <= 0:
        return 1
    share = int if agree is None else agree
    short = min(SHORT_PILOT * time_batch(SHORT_PILOT) for _ in range(2))
    most = short / SHORT_PILOT  # microseconds a call takes at most
    per_call, start = most, 0.0
    if int(share(LONG_PILOT if most < 4 * sample_us else 0)):
        long = min(LONG_PILOT * time_batch(LONG_PILOT) for _ in range(2))
        most = min(most, long / LONG_PILOT)
        per_call = min(most, max((long - short) / (LONG_PILOT - SHORT_PILOT), most / 4))
        start = max(0.0, short - SHORT_PILOT * per_call)  # what starting a sample costs beyond its calls
    calls = min(100, math.ceil(sample_us / max(per_call, 1e-3)))
    calls = max(calls, min(MAX_CALLS, math.ceil(START_SHARE * start / max(per_call, 1e-3))))
    return int(share(max(1, calls)))


def graph_median_us(fn, warmup: int, iters: int, sample_us: float = 50.0, agree=None, before_each=None) -> float:
    """Median microseconds per call of ``fn`` replayed from a CUDA graph (GPU only).

    The graph holds a batch of calls sized as in :func:`median_us`, captured once on a side stream;
    a sample is one replay between two CUDA events. This is how inference engines run small
    collectives: no host work per call at all. ``before_each``: before each pilot that sizes the batch.
    """
    for _ in range(warmup):
        fn()
    batch = batch_size(sample_us, agree, _gpu_us_per_call(fn, before_each))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(batch):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return statistics.median([start.elapsed_time(end) * 1e3 / batch for start, end in events])


def host_us(fn, calls: int = 200) -> float:
    """Host microseconds per call of ``fn`` issued back to back (what the CPU spends before the GPU
    gets the work; the GPU is waited for once at the end, outside the figure)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return seconds / calls * 1e6


def host_us_batches(fn, calls: int, batches: int) -> tuple[float, float]:
    """(median, least) over ``batches`` of :func:`host_us` with ``calls`` calls each (the GPU waited for
    before and after each batch): the probes' figure, where one batch can fall in a slow spell of the host."""
    per_call = [host_us(fn, calls) for _ in range(batches)]
    return statistics.median(per_call), min(per_call)


def why_not(exc: Exception) -> str:
    """A row's note for an implementation that cannot run here: the exception's type and the first line of its
    message (at most 100 characters).

    Example:
        >>> why_not(RuntimeError("NCCL error\\nmore"))
        'RuntimeError: NCCL error'
    """
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
