"""Write benchmarks/results/README.md (a table of the canonical runs and their figures) and the figures the
hand-written pages quote (benchmarks/claims.py).

    python benchmarks/summarize_results.py           # rewrite benchmarks/results/README.md and the pages' claims
    python benchmarks/summarize_results.py --check   # exit 1 if either is stale

benchmarks/results/ keeps one run per benchmark, GPU kind and world size: ``<benchmark>_<gpu-kind>_<N>ranks.csv``
and its ``.png`` (the names benchmarks/_results.default_csv gives, so a rerun replaces them). After the table of
files come the figures of the reference platform (2 x H200): per benchmark, a table of numbers read from its
canonical CSV (:func:`figures`; :func:`ccl_figures`, :func:`latency_figures`, :func:`ops_figures`,
:func:`rma_figures`). Needs neither torch nor a GPU: the docs' hook (docs/hooks/benchmark_results.py) draws its
tables with these functions too. The same command sets the text of every ``<!-- claim NAME -->TEXT<!-- /claim
-->`` in README.md and docs/**/*.md to what the claim computes from the CSVs (benchmarks/claims.py).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from _rows import (CCL_COLLECTIVES, COMMAND, REFERENCE_GPU, REFERENCE_RANKS, RESULTS, ccl_method, ccl_times,  # noqa: F401
                   number as _float, size_label as _size)

# benchmarks/<name>.py, each writing <name>_<gpu>_<N>ranks.csv
BENCHMARKS = ("all_to_all_v", "ccl", "gemm", "latency", "moe", "ops", "rma", "rmsnorm", "tp_decode")
_NAME = re.compile(rf"^({'|'.join(BENCHMARKS)})_([a-z0-9]+(?:-[a-z0-9]+)*)_([1-9][0-9]*)ranks(\.csv|\.png)$")


def gpu_slug(gpu_name: str) -> str:
    """The GPU kind in a file name, without the memory size and type some boards add to their name:
    ``NVIDIA H200`` -> ``nvidia-h200``, ``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100``."""
    kind = re.sub(r"[\s-]*\d+\s*GB\b.*$", "", gpu_name, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-")


def canonical_name(benchmark: str, gpu_name: str, world: int, suffix: str = ".csv") -> str:
    """``<benchmark>_<gpu-kind>_<N>ranks<suffix>``, e.g. ``ccl_nvidia-h200_2ranks.csv``."""
    return f"{benchmark}_{gpu_slug(gpu_name)}_{world}ranks{suffix}"


def parse_name(name: str) -> tuple[str, str, int, str] | None:
    """(benchmark, gpu kind, ranks, suffix) of a canonical file name, else None."""
    match = _NAME.match(name)
    return None if match is None else (match[1], match[2], int(match[3]), match[4])


@dataclass(frozen=True)
class Run:
    benchmark: str
    gpu: str  # as the CSV names it (its gpu column)
    ranks: int
    commits: tuple[str, ...]  # the CSV's commit column, each once, in the file's order
    csv: str
    png: str | None


def table_rows(results: Path = RESULTS, benchmark: str | None = None) -> list[Run]:
    """The canonical runs under ``results`` (one benchmark's with ``benchmark``), by benchmark, GPU and ranks."""
    runs = []
    for path in sorted(results.glob("*.csv")):
        parsed = parse_name(path.name)
        if parsed is None or benchmark not in (None, parsed[0]):
            continue
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        gpu = rows[0].get("gpu") or parsed[1] if rows else parsed[1]
        commits = tuple(dict.fromkeys(r.get("commit") or "unknown" for r in rows))
        png = path.with_suffix(".png")
        runs.append(Run(parsed[0], gpu, parsed[2], commits, path.name, png.name if png.exists() else None))
    return sorted(runs, key=lambda r: (r.benchmark, r.gpu, r.ranks))


def table(runs: list[Run], link=lambda name: name) -> str:
    """A Markdown table of ``runs``; ``link(file name)`` is the address each file's link points at."""
    lines = ["| benchmark | figure | GPU | ranks | commit | file |", "|---|---|---|---|---|---|"]
    for r in runs:
        figure = f"[{r.png}]({link(r.png)})" if r.png else "(no plot)"
        lines.append(f"| {r.benchmark} | {figure} | {r.gpu} | {r.ranks} | {', '.join(r.commits)} | "
                     f"[{r.csv}]({link(r.csv)}) |")
    return "\n".join(lines)


# --- Figures: the numbers of the reference platform's runs, one table (or two) per benchmark ----------------

CCL_SIZES = (1 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20)  # bytes per rank, where the CSV has them
RMA_SIZES = (1 << 20, 8 << 20, 64 << 20, 256 << 20)
OPS_SHAPES = ((128, 8192), (1024, 8192), (16384, 8192))  # (M, N); K as the CSV says
_NONE = "–"



def _us(value: float | None) -> str:
    if value is None:
        return _NONE
    return f"{value:.2f}" if value < 10 else f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def _gbps(value: float) -> str:
    return f"{value:.1f}" if value < 100 else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return _NONE if value is None else f"{value:.2f}×"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


CCL_METHODS = ("device", "eager", "graph")  # the order of the tables by method; ccl's "host" rows are left out
METHOD_TITLES = {"device": "Device time per call (CUDA events around back-to-back calls)",
                 "eager": "Host-inclusive eager time per call", "graph": "CUDA graph replay per call"}



def _calls(rows: list[dict], method: str) -> str:
    """``"20 "`` where every row of ``method`` took 20 calls a sample (its calls_per_sample), else ``""``."""
    found = {r.get("calls_per_sample") or "" for r in rows if ccl_method(r)[1] == method}
    calls = found.pop() if len(found) == 1 else ""
    return f"{calls} " if calls.isdigit() else ""


def ccl_title(method: str, rows: list[dict]) -> str:
    """What ``method``'s figures mean, as the heading of its table (the calls per sample where the CSV says)."""
    calls = _calls(rows, method)
    return {"device": f"Device time per call (CUDA events around {calls or 'a batch of '}back-to-back calls, "
                      "nccl-tests' method)",
            "eager": f"Host-inclusive eager time per call (the wall clock around {calls}back-to-back calls, the "
                     "GPU waited for once at the end)",
            "graph": f"CUDA graph replay per call ({calls or 'a batch of '}calls captured once, one replay "
                     "between CUDA events)"}[method]


def _ccl_table(times: dict, method: str) -> str | None:
    """One method's table of :func:`ccl_figures` (``times`` as :func:`ccl_times` gives them)."""

    def best(prefix, collective, nbytes):
        found = [(us, impl.removeprefix(prefix)) for (m, c, b, impl), us in times.items()
                 if (m, c, b) == (method, collective, nbytes) and impl.startswith(prefix) and impl != "iris.copy_in"]
        return f"{_us(min(found)[0])} ({min(found)[1]})" if found else _NONE

    rows = []
    for collective in CCL_COLLECTIVES:
        first = True
        for nbytes in CCL_SIZES:
            iris = times.get((method, collective, nbytes, "iris"))
            nccl = times.get((method, collective, nbytes, "nccl"))
            if iris is None and nccl is None:
                continue
            rows.append([collective if first else "", _size(nbytes), _us(iris), best("iris.", collective, nbytes),
                         _us(nccl), best("symm_mem.", collective, nbytes),
                         _ratio(nccl / iris if iris and nccl else None)])
            first = False
    header = ["collective", "size per rank", "Iris (µs)", "best Iris variant (µs)", "NCCL (µs)",
              "symm_mem best (µs)", "NCCL / Iris"]
    return _markdown(header, rows) if rows else None


def ccl_figures(rows: list[dict]) -> str:
    """Each collective at :data:`CCL_SIZES`: Iris's default, its best variant (``iris.copy_in``, a path rather
    than a variant, left out), NCCL, torch symmetric memory's best (µs per call, medians) and NCCL / Iris (above
    1: Iris is faster); a table per method the CSV has (:func:`ccl_method`), in the order of :data:`CCL_METHODS`,
    each ratio between two figures of the same method. Host-profile rows (method host) are left out."""
    times = ccl_times(rows)
    parts = []
    for method in CCL_METHODS:
        text = _ccl_table(times, method)
        if text:
            parts.append(f"{ccl_title(method, rows)}. Medians in µs; NCCL / Iris above 1: Iris is faster.\n\n{text}")
    return "\n\n".join(parts)


def rma_figures(rows: list[dict]) -> str:
    """GB/s of each op at :data:`RMA_SIZES` and its ratio to the copy engine in the same run (the first pair the
    CSV lists for each op and size)."""
    cells: dict[tuple[str, int], dict] = {}
    for r in rows:
        if _float(r.get("gbps")) is not None and r.get("bytes", "").isdigit():
            cells.setdefault((r["op"], int(r["bytes"])), r)
    ops = list(dict.fromkeys(op for op, _ in cells))
    sizes = [n for n in RMA_SIZES if any((op, n) in cells for op in ops)]

    def cell(op, nbytes):
        r = cells.get((op, nbytes))
        if r is None:
            return _NONE
        ratio = _float(r.get("ratio_to_copy_engine"))
        return _gbps(float(r["gbps"])) + ("" if op == "copy_engine" or ratio is None else f" ({ratio:.2f}×)")

    table = _markdown(["op"] + [_size(n) for n in sizes], [[op] + [cell(op, n) for n in sizes] for op in ops])
    return f"GB/s (ratio to the copy engine):\n\n{table}" if ops else ""


def latency_figures(rows: list[dict]) -> str:
    """Each measure and impl's median time in µs."""
    data = [[r["measure"], r["impl"], r.get("pair", ""), _us(_float(r["us"]))] for r in rows
            if _float(r.get("us")) is not None]
    return _markdown(["measure", "impl", "pair", "µs"], data) if data else ""


def ops_figures(rows: list[dict]) -> str:
    """Each fused op at :data:`OPS_SHAPES`: its time, ``torch.matmul`` then NCCL's, the speedup (torch + NCCL
    over fused) and torch's own fused op where it has one, in µs."""
    chosen: dict[str, dict[tuple[int, int], dict]] = {}  # op -> (M, N) -> the CSV's first row of that shape
    for r in rows:
        shape = (int(r["M"]), int(r["N"]))
        if shape in OPS_SHAPES and _float(r.get("fused_us")) is not None:
            chosen.setdefault(r["op"], {}).setdefault(shape, r)
    data = []
    for op, shapes in chosen.items():
        for i, r in enumerate(shapes[shape] for shape in OPS_SHAPES if shape in shapes):
            data.append([op if i == 0 else "", f"{r['M']} × {r['N']} × {r['K']}", _us(_float(r["fused_us"])),
                         _us(_float(r.get("torch+nccl_us"))), _ratio(_float(r.get("speedup"))),
                         _us(_float(r.get("torch fused_us")))])
    header = ["op", "M × N × K", "fused (µs)", "torch + NCCL (µs)", "speedup", "torch fused (µs)"]
    return _markdown(header, data) if data else ""


def _side_by_side(rows: list[dict], keys: tuple[str, ...], names: tuple[str, ...], reference: str,
                  baseline: str) -> str:
    """One row per ``keys`` value, a µs column per impl (in the CSV's order) and ``baseline`` / ``reference``; a
    table per timing method where the CSV has a method column (device, eager, graph), each under its title."""
    methods = list(dict.fromkeys(r.get("method") or "" for r in rows))
    if methods == [""]:
        return _one_side_by_side(rows, keys, names, reference, baseline)
    methods.sort(key=lambda m: (CCL_METHODS.index(m) if m in CCL_METHODS else len(CCL_METHODS), m))
    return "\n\n".join(f"{METHOD_TITLES.get(m, m or 'No method')}:\n\n"
                        + _one_side_by_side([r for r in rows if (r.get("method") or "") == m], keys, names,
                                            reference, baseline) for m in methods)


def _one_side_by_side(rows, keys, names, reference, baseline) -> str:
    impls = list(dict.fromkeys(r["impl"] for r in rows))
    times = {(tuple(r[k] for k in keys), r["impl"]): _float(r["us"]) for r in rows}
    points = list(dict.fromkeys(tuple(r[k] for k in keys) for r in rows))
    data = []
    for point in points:
        ours, theirs = times.get((point, reference)), times.get((point, baseline))
        data.append([*point, *[_us(times.get((point, impl))) for impl in impls],
                     _ratio(theirs / ours if ours and theirs else None)])
    return _markdown([*names, *[f"{impl} (µs)" for impl in impls], f"{baseline} / {reference}"], data)


def rmsnorm_figures(rows: list[dict]) -> str:
    """All-reduce + residual add + RMSNorm per (tokens, hidden): each way's median µs, and Iris all_reduce + torch
    over the fused kernel."""
    return _side_by_side(rows, ("tokens", "hidden"), ("tokens", "hidden"), "iris.fused", "iris+torch") if rows else ""


def all_to_all_v_figures(rows: list[dict]) -> str:
    """all_to_all_v per size: Iris with device counts and NCCL with host splits, median µs, and their ratio."""
    return _side_by_side(rows, ("bytes",), ("bytes per rank",), "iris.device_counts", "nccl.splits") if rows else ""


def moe_figures(rows: list[dict]) -> str:
    """MoE dispatch, combine and the round trip per tokens per rank: Iris and the PyTorch path, median µs."""
    return _side_by_side(rows, ("tokens",), ("tokens per rank",), "iris.round_trip", "torch.nccl.round_trip") \
        if rows else ""


def tp_decode_figures(rows: list[dict]) -> str:
    """The TP MLP decode step per (hidden, batch): Iris's and NCCL's median µs per token, and their ratio."""
    return _side_by_side(rows, ("hidden", "batch"), ("hidden", "batch"), "iris", "nccl") if rows else ""


def gemm_figures(rows: list[dict]) -> str:
    """iris.ops.matmul per (M, N, K) on one GPU: cuBLAS, the persistent and the tuned kernel, median µs, and cuBLAS
    over the tuned kernel (1 or more: at cuBLAS's speed)."""
    return _side_by_side(rows, ("M", "N", "K"), ("M", "N", "K"), "iris_tuned", "cublas") if rows else ""


FIGURES = {"all_to_all_v": all_to_all_v_figures, "ccl": ccl_figures, "gemm": gemm_figures, "latency": latency_figures,
           "moe": moe_figures, "ops": ops_figures, "rma": rma_figures, "rmsnorm": rmsnorm_figures,
           "tp_decode": tp_decode_figures}


def figures(benchmark: str, results: Path = RESULTS, link=lambda name: name) -> str | None:
    """The figures of ``benchmark`` on the reference platform, after a line naming the CSV (linked with
    ``link``), GPU, ranks and commits; None where results/ holds no such run or it gives no table."""
    path = results / f"{benchmark}_{REFERENCE_GPU}_{REFERENCE_RANKS}ranks.csv"
    if benchmark not in FIGURES or not path.exists():
        return None
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    text = FIGURES[benchmark](rows)
    if not rows or not text:
        return None
    commits = ", ".join(dict.fromkeys(r.get("commit") or "unknown" for r in rows))
    gpu = rows[0].get("gpu") or REFERENCE_GPU
    return (f"From [{path.name}]({link(path.name)}): {gpu}, {REFERENCE_RANKS} ranks, "
            f"commit{'s' if ',' in commits else ''} {commits}.\n\n{text}")


def readme(results: Path = RESULTS) -> str:
    """benchmarks/results/README.md as the command writes it."""
    return (f"<!-- Generated by `{COMMAND}` from the CSVs beside it: do not edit by hand. -->\n\n"
            "# Benchmark results\n\n"
            f"Generated by `{COMMAND}`. One run per benchmark, GPU kind and world size, the latest: "
            "`<benchmark>_<gpu-kind>_<N>ranks.csv` (tidy: one row per measurement, keyed by GPU, world size, "
            "version and commit) and its plot. A run of `benchmarks/<benchmark>.py` without `--csv` replaces "
            "its file here; A/B arms and one-off runs go to a path named with `--csv`, outside this folder. "
            "A file with several commits holds rows of several runs (each row says its commit).\n\n"
            f"{table(table_rows(results))}\n\n"
            f"## Figures of the reference platform (`{REFERENCE_GPU}`, {REFERENCE_RANKS} ranks)\n\n"
            "Read from each benchmark's canonical CSV by the same command; the benchmarks page shows them too.\n"
            + "".join(f"\n### {benchmark}\n\n{text}\n" for benchmark in BENCHMARKS
                      if (text := figures(benchmark, results)) is not None))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if README.md or a page's claim differs from what it would write")
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results folder (benchmarks/results)")
    args = parser.parse_args()
    import claims  # benchmarks/claims.py, beside this file (it reads this module's helpers)

    path = args.results / "README.md"
    text = readme(args.results)
    try:
        changed, unfixable = claims.update(claims.compute(args.results))
    except claims.ClaimError as exc:
        print(f"{exc}: rewrite the sentence that quotes it (or the claim)")
        return 1
    for problem in unfixable:
        print(problem)
    if unfixable:
        return 1
    if args.check:
        stale = ([path] if not path.exists() or path.read_text() != text else []) + list(changed)
        for page in stale:
            print(f"{page} is stale: run {COMMAND}")
        return 1 if stale else 0
    path.write_text(text)
    print(f"wrote {path}")
    for page, new in changed.items():
        page.write_text(new)
        print(f"rewrote the claims of {page}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
