"""Figures quoted in prose, computed from the canonical CSVs of benchmarks/results/: claims.

A claim is a named function of one canonical CSV's rows that returns a short string ("1.2x", "1.05-1.21x",
"96%"). :data:`CLAIMS` holds them all, declared below with :func:`claim`, each with a docstring saying which
rows, which columns and which timing method it reads. A hand-written page (README.md, docs/**/*.md) quotes a
claim as

    <!-- claim NAME -->TEXT<!-- /claim -->

where TEXT is what the claim computes now. ``python benchmarks/summarize_results.py`` rewrites every TEXT from
the CSVs (``--check``: exit 1 where one is stale); tests/test_docs.py fails on a TEXT that differs from its
claim, on a name no claim has, and on a measured figure outside a claim in the README, the benchmarks page and
the collectives guide.

Ratios have two decimals below 1.1 (where the distance from 1 is the figure) and one above; a range takes
its lower end's decimals for both ends. A claim whose rows are missing, or whose sentence states a condition
the data no longer meets, raises :class:`ClaimError`: then the sentence must change, not only its figure.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import _rows as summary

ROOT = Path(__file__).resolve().parents[1]
SPAN = re.compile(r"<!-- claim ([\w.-]+) -->((?:(?!<!--).)*?)<!-- /claim -->", re.DOTALL)
MARKER = re.compile(r"<!-- /?claim\b.*?-->", re.DOTALL)  # every claim marker, paired or not
# A line that opens with a comment is an HTML block to Markdown (GitHub's and mkdocs'): it would cut the paragraph.
OPENS_LINE = re.compile(r"^[ \t]*<!-- /?claim\b", re.MULTILINE)


class ClaimError(ValueError):
    """The data cannot give a claim: its rows are missing, or the condition its sentence states fails."""


@dataclass(frozen=True)
class Claim:
    name: str
    csv: str  # the canonical CSV it reads, e.g. ccl_nvidia-h200_2ranks.csv
    compute: Callable[[list[dict]], str]


CLAIMS: dict[str, Claim] = {}


def claim(benchmark: str, gpu: str = summary.REFERENCE_GPU, ranks: int = summary.REFERENCE_RANKS):
    """Declare the function below as the claim of its name, reading ``<benchmark>_<gpu>_<ranks>ranks.csv``
    (the reference platform's unless told)."""

    def register(compute: Callable[[list[dict]], str]):
        CLAIMS[compute.__name__] = Claim(compute.__name__, f"{benchmark}_{gpu}_{ranks}ranks.csv", compute)
        return compute

    return register


def compute(results: Path = summary.RESULTS) -> dict[str, str]:
    """name -> TEXT of every claim, from the CSVs under ``results``."""
    tables: dict[str, list[dict]] = {}
    found = {}
    for c in CLAIMS.values():
        if c.csv not in tables:
            if not (results / c.csv).exists():
                raise ClaimError(f"claim {c.name}: {results / c.csv} does not exist")
            with open(results / c.csv, newline="") as f:
                tables[c.csv] = list(csv.DictReader(f))
        try:
            found[c.name] = c.compute(tables[c.csv])
        except ClaimError as exc:
            raise ClaimError(f"claim {c.name} ({c.csv}): {exc}") from None
    return found


# --- Pages ------------------------------------------------------------------------------------------------

def pages(root: Path = ROOT) -> list[Path]:
    """The pages that may quote claims: README.md and docs/**/*.md."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _same(written: str, computed: str) -> bool:
    return " ".join(written.split()) == computed  # a page may wrap a claim's text over two lines


def problems(text: str, computed: dict[str, str]) -> list[str]:
    """What is wrong with the claims ``text`` quotes, given ``computed`` (name -> TEXT): a TEXT that differs from
    its claim's, a name no claim has, a marker without its pair, a marker at the start of a line."""
    found = []
    for match in SPAN.finditer(text):
        name, written = match.group(1), match.group(2)
        if name not in computed:
            found.append(f"claim {name}: benchmarks/claims.py declares no such claim")
        elif not _same(written, computed[name]):
            found.append(f"claim {name}: the page says {written!r}, the CSVs give {computed[name]!r}: "
                         f"run {summary.COMMAND}")
    if len(MARKER.findall(text)) != 2 * len(SPAN.findall(text)):
        found.append("a claim marker without its pair: write <!-- claim NAME -->TEXT<!-- /claim -->")
    if OPENS_LINE.search(text):
        found.append("a claim marker opens a line, where Markdown reads it as an HTML block that cuts the paragraph: "
                     "move a word before it")
    return found


def rewrite(text: str, computed: dict[str, str]) -> str:
    """``text`` with the TEXT of every claim it quotes set to ``computed``'s (unknown names left alone)."""

    def fill(match):
        name, written = match.group(1), match.group(2)
        if name not in computed or _same(written, computed[name]):
            return match.group(0)
        return f"<!-- claim {name} -->{computed[name]}<!-- /claim -->"

    return SPAN.sub(fill, text)


def update(computed: dict[str, str], root: Path = ROOT) -> tuple[dict[Path, str], list[str]]:
    """({page: its new text} for the pages whose claims are stale, [what a rewrite cannot fix: unknown names,
    unpaired markers, markers opening a line, each after its page])."""
    changed, unfixable = {}, []
    for page in pages(root):
        text = page.read_text()
        new = rewrite(text, computed)
        unfixable += [f"{page.relative_to(root)}: {p}" for p in problems(new, computed)]
        if new != text:
            changed[page] = new
    return changed, unfixable


# --- How a claim writes its figure ------------------------------------------------------------------------

def _decimals(value: float) -> int:
    return 2 if value < 1.1 else 1 if value < 10 else 0


def ratios(values) -> str:
    """``[1.21, 1.05]`` -> ``1.05-1.21x``; one value, or a range whose ends print alike: ``1.2x``."""
    values = list(values)
    if not values:
        raise ClaimError("no point to compute it from")
    decimals = _decimals(min(values))
    low, high = f"{min(values):.{decimals}f}", f"{max(values):.{decimals}f}"
    return f"{low}x" if low == high else f"{low}-{high}x"


def percents(values) -> str:
    """``[0.956, 0.961]`` -> ``96%``; ``[0.94, 0.96]`` -> ``94-96%``."""
    values = list(values)
    if not values:
        raise ClaimError("no point to compute it from")
    low, high = f"{100 * min(values):.0f}", f"{100 * max(values):.0f}"
    return f"{low}%" if low == high else f"{low}-{high}%"


def _figures(rows: list[dict], keys: tuple[str, ...], column: str = "us",
             method: str | None = None) -> dict[tuple, dict[str, float]]:
    """{point (the ``keys`` columns, as ints): {impl: ``column``}} of a side-by-side CSV (rmsnorm, tp_decode, moe,
    all_to_all_v: one row per point, impl and, in a CSV with a method column, method). ``method``: the rows of
    that timing method, a row without a method counting as one of it (the claim's docstring says why); a CSV of
    several methods needs one named."""
    if method is None and len({r.get("method") or "" for r in rows}) > 1:
        raise ClaimError("the CSV holds several timing methods: name the one the sentence quotes")
    points: dict[tuple, dict[str, float]] = {}
    for r in rows:
        value = summary.number(r.get(column))
        if value is not None and (method is None or (r.get("method") or method) == method):
            points.setdefault(tuple(int(r[k]) for k in keys), {})[r["impl"]] = value
    return points


def _over(rows, keys, numerator, denominator, where=lambda *point: True, column="us", method=None) -> list[float]:
    """``numerator``'s ``column`` over ``denominator``'s at every point (``keys``) ``where`` accepts, by
    ``method`` (:func:`_figures`)."""
    return [p[numerator] / p[denominator] for point, p in _figures(rows, keys, column, method).items()
            if where(*point) and numerator in p and denominator in p]


# --- The claims ---------------------------------------------------------------------------------------------
# ccl: summary.ccl_times reads both CSV formats (the method column, or the older "+graph" names).

CCL_COLLECTIVES = summary.CCL_COLLECTIVES


def _ccl_points(rows, method):
    """{(collective, bytes): (Iris's default µs, NCCL's µs)} of ``method``, where both have a figure."""
    times = summary.ccl_times(rows)
    return {(c, b): (times[(m, c, b, "iris")], us) for (m, c, b, impl), us in times.items()
            if m == method and impl == "nccl" and c in CCL_COLLECTIVES and (m, c, b, "iris") in times}


@claim("ccl")
def ccl_graph_nccl_over_iris(rows):
    """NCCL's time per call over Iris's default variant's (impls ``nccl`` and ``iris``), both replayed from a CUDA
    graph (method graph), at every collective (all_reduce, all_gather, reduce_scatter, all_to_all) and size both
    were replayed at: the range."""
    return ratios(nccl / iris for iris, nccl in _ccl_points(rows, "graph").values())


@claim("ccl")
def ccl_graph_sizes(rows):
    """The smallest and largest size per rank at which Iris's default and NCCL were both replayed from a CUDA
    graph (method graph): "1 KiB to 1 MiB"."""
    sizes = sorted({b for _, b in _ccl_points(rows, "graph")})
    if not sizes:
        raise ClaimError("no graph-replayed rows of both iris and nccl")
    return f"{summary.size_label(sizes[0])} to {summary.size_label(sizes[-1])}"


@claim("ccl")
def ccl_iris_ahead_sizes(rows):
    """The sizes per rank measured, "1 KiB to 256 MiB", where at every one of them and every collective Iris's
    default takes less time per call than NCCL: replayed from a CUDA graph (method graph) where both were,
    else by device time (method device: CUDA events around back-to-back calls). ClaimError where it does not."""
    graph, device = _ccl_points(rows, "graph"), _ccl_points(rows, "device")
    behind = [f"{c} at {summary.size_label(b)}" for (c, b), (iris, nccl) in {**device, **graph}.items() if iris >= nccl]
    if behind:
        raise ClaimError(f"Iris is not ahead of NCCL at {', '.join(behind)}")
    sizes = sorted({b for _, b in {**device, **graph}})
    if not sizes:
        raise ClaimError("no rows of both iris and nccl")
    return f"{summary.size_label(sizes[0])} to {summary.size_label(sizes[-1])}"


@claim("ccl")
def ccl_all_reduce_256mib(rows):
    """all_reduce at 256 MiB per rank by device time (method device: CUDA events around back-to-back calls):
    NCCL's time per call over Iris's default variant's."""
    point = _ccl_points(rows, "device").get(("all_reduce", 256 << 20))
    if point is None:
        raise ClaimError("no device rows of iris and nccl for all_reduce at 256 MiB")
    return ratios([point[1] / point[0]])


RMA_SM_OPS = ("put", "get", "load", "store")  # the transfers the GPU's SMs issue


def _rma_ratios(rows) -> dict[int, dict[str, float]]:
    """{bytes: {op: ratio_to_copy_engine}} of :data:`RMA_SM_OPS`, the first pair the CSV lists at each size."""
    found: dict[int, dict[str, float]] = {}
    for r in rows:
        ratio = summary.number(r.get("ratio_to_copy_engine"))
        if r["op"] in RMA_SM_OPS and ratio is not None:
            found.setdefault(int(r["bytes"]), {}).setdefault(r["op"], ratio)
    return found


@claim("rma")
def rma_share_256mib(rows):
    """put, get, load and store at 256 MiB: each one's GB/s over the copy engine's in the same run (the
    ratio_to_copy_engine column), as a percentage (a range where they differ)."""
    at = _rma_ratios(rows).get(256 << 20, {})
    if set(at) != set(RMA_SM_OPS):
        raise ClaimError(f"256 MiB lacks some of {RMA_SM_OPS}")
    return percents(at.values())


@claim("rma")
def rma_lead_sizes(rows):
    """The first and last size, "8 and 64 MiB", of the sizes at which put, get, load and store all move more
    GB/s than the copy engine (ratio_to_copy_engine above 1); ClaimError unless those are consecutive sizes of
    the CSV."""
    by_size = _rma_ratios(rows)
    sizes = sorted(by_size)
    lead = [i for i, n in enumerate(sizes) if set(by_size[n]) == set(RMA_SM_OPS) and min(by_size[n].values()) > 1]
    if not lead or lead != list(range(lead[0], lead[-1] + 1)):
        raise ClaimError(f"the sizes where every SM-issued op leads the copy engine are not one run: {lead}")
    low, high = summary.size_label(sizes[lead[0]]).split(), summary.size_label(sizes[lead[-1]]).split()
    return f"{low[0]} and {' '.join(high)}" if low[1] == high[1] else f"{' '.join(low)} and {' '.join(high)}"


@claim("ops")
def ops_speedup(rows):
    """Every fused op at every shape: the speedup column (``torch.matmul`` then NCCL, over the fused op), the
    range."""
    return ratios(v for r in rows if (v := summary.number(r.get("speedup"))) is not None)


@claim("rmsnorm")
def rmsnorm_fused_1_64_tokens(rows):
    """Iris all_reduce + torch's time over the fused kernel's (impls ``iris+torch`` and ``iris.fused``, column us)
    at 1-64 tokens, every hidden size, by device time (method device: CUDA events around back-to-back calls, each
    sample after the ranks meet; the rows of a CSV without a method column were timed so): the range."""
    return ratios(_over(rows, ("tokens", "hidden"), "iris+torch", "iris.fused", lambda t, h: t <= 64,
                        method="device"))


@claim("rmsnorm")
def rmsnorm_fused_128_512_tokens(rows):
    """As :func:`rmsnorm_fused_1_64_tokens`, at 128-512 tokens."""
    return ratios(_over(rows, ("tokens", "hidden"), "iris+torch", "iris.fused", lambda t, h: 128 <= t <= 512,
                        method="device"))


@claim("tp_decode")
def tp_decode_nccl_over_iris(rows):
    """The decode step's time with NCCL's all-reduce over Iris's (impls ``nccl`` and ``iris``, column us), replayed
    from a CUDA graph (method graph; the rows of a CSV without a method column were timed so), every hidden size
    and batch: the range."""
    return ratios(_over(rows, ("hidden", "batch"), "nccl", "iris", method="graph"))


@claim("tp_decode")
def tp_decode_symm_mem_over_iris(rows):
    """As :func:`tp_decode_nccl_over_iris`, torch symmetric memory's (impl ``symm_mem``) over Iris's."""
    return ratios(_over(rows, ("hidden", "batch"), "symm_mem", "iris", method="graph"))


@claim("tp_decode")
def tp_decode_comm_batch_1_16(rows):
    """Iris's communication share over NCCL's (column comm_us: a way's step minus the step without an all-reduce),
    replayed from a CUDA graph (method graph, as :func:`tp_decode_nccl_over_iris`), at batch 1-16, every hidden
    size: the range."""
    return ratios(_over(rows, ("hidden", "batch"), "iris", "nccl", lambda h, b: b <= 16, "comm_us", "graph"))


@claim("tp_decode")
def tp_decode_comm_batch_32_64(rows):
    """As :func:`tp_decode_comm_batch_1_16`, at batch 32 and 64."""
    return ratios(_over(rows, ("hidden", "batch"), "iris", "nccl", lambda h, b: b in (32, 64), "comm_us", "graph"))


# moe and all_to_all_v: CSVs without a method column, every call issued one by one (not replayed, but for
# iris.round_trip.graph) and timed with CUDA events around back-to-back calls, each sample after a device barrier.

@claim("moe")
def moe_round_trip(rows):
    """The PyTorch path's round trip over Iris's (impls ``torch.nccl.round_trip`` and ``iris.round_trip``, column
    us, neither replayed), every tokens per rank: the range."""
    return ratios(_over(rows, ("tokens",), "torch.nccl.round_trip", "iris.round_trip"))


@claim("moe")
def moe_round_trip_graph_128(rows):
    """The PyTorch path's round trip (impl ``torch.nccl.round_trip``, not replayed: it waits on the host for its
    splits) over Iris's replayed from a CUDA graph (impl ``iris.round_trip.graph``) at 128 tokens per rank."""
    return ratios(_over(rows, ("tokens",), "torch.nccl.round_trip", "iris.round_trip.graph", lambda t: t == 128))


@claim("moe")
def moe_round_trip_graph_512(rows):
    """As :func:`moe_round_trip_graph_128`, at 512 tokens per rank."""
    return ratios(_over(rows, ("tokens",), "torch.nccl.round_trip", "iris.round_trip.graph", lambda t: t == 512))


@claim("moe")
def moe_round_trip_fp8(rows):
    """The PyTorch path's round trip over Iris's with the rows dispatched as fp8 (impl ``iris.round_trip.fp8``),
    neither replayed, every tokens per rank: the range."""
    return ratios(_over(rows, ("tokens",), "torch.nccl.round_trip", "iris.round_trip.fp8"))


@claim("all_to_all_v")
def all_to_all_v_16_256mib(rows):
    """NCCL's time with host splits over Iris's with the counts on the device (impls ``nccl.splits`` and
    ``iris.device_counts``, column us) at 16-256 MiB per rank: the range."""
    return ratios(_over(rows, ("bytes",), "nccl.splits", "iris.device_counts",
                        lambda b: 16 << 20 <= b <= 256 << 20))


# gemm: one GPU (an H100 so far), bf16, cuBLAS (impl cublas) beside iris.ops.matmul's default kernel (iris) and
# the tuned one (iris_tuned), each timed replayed from a CUDA graph (method graph) and back to back (device).

@claim("gemm", gpu="nvidia-h100", ranks=1)
def gemm_tuned_graph_large(rows):
    """cuBLAS's time over the tuned kernel's (impls ``cublas`` and ``iris_tuned``), replayed from a CUDA graph
    (method graph), at M >= 1024: the range."""
    return ratios(_over(rows, ("M", "N", "K"), "cublas", "iris_tuned", lambda m, n, k: m >= 1024, method="graph"))


@claim("gemm", gpu="nvidia-h100", ranks=1)
def gemm_tuned_graph_decode(rows):
    """As :func:`gemm_tuned_graph_large`, at M <= 128 (decode rows)."""
    return ratios(_over(rows, ("M", "N", "K"), "cublas", "iris_tuned", lambda m, n, k: m <= 128, method="graph"))


@claim("gemm", gpu="nvidia-h100", ranks=1)
def gemm_tuned_device_decode(rows):
    """cuBLAS's time over the tuned kernel's back to back without a graph (method device: CUDA events around
    calls issued one after another) at M <= 128: the range."""
    return ratios(_over(rows, ("M", "N", "K"), "cublas", "iris_tuned", lambda m, n, k: m <= 128, method="device"))


@claim("gemm", gpu="nvidia-h100", ranks=1)
def gemm_persistent_graph(rows):
    """cuBLAS's time over the default persistent kernel's (impl ``iris``), replayed from a CUDA graph (method
    graph), at every shape: the range."""
    return ratios(_over(rows, ("M", "N", "K"), "cublas", "iris", method="graph"))
