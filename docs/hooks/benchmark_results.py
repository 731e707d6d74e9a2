"""mkdocs hook: publish the canonical benchmark results and draw their tables and plots into a page.

mkdocs serves only what lies under docs/, and the results belong to benchmarks/results/ (the
benchmarks write them there). Rather than keep a second copy, this hook adds the canonical runs of
benchmarks/results/ (``<benchmark>_<gpu-kind>_<N>ranks.csv`` and ``.png``, one per benchmark, GPU kind
and world size) to the site under ``results/``, and replaces these lines of a page:

    <!-- results table -->              the summary table of every run (benchmark, figure, GPU, ranks,
                                        commit, file), as benchmarks/summarize_results.py writes it
    <!-- results table BENCHMARK -->    the rows of one benchmark (ccl, latency, ops, rma)
    <!-- plots PREFIX -->               every plot whose file name starts with PREFIX
    <!-- figures BENCHMARK -->          the figures of one benchmark on the reference platform (2 x H200),
                                        a table read from its canonical CSV, after a line naming the CSV,
                                        GPU, ranks and commits (summarize_results.figures)

so a new run appears without editing the page. Links are relative to the page. A marker that
matches nothing is a warning, which ``mkdocs build --strict`` turns into a failure.
"""

from __future__ import annotations

import importlib.util
import logging
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SITE_FOLDER = "results"
PLOTS = re.compile(r"^<!-- plots (\S+) -->$", re.MULTILINE)
FIGURES = re.compile(r"^<!-- figures (\S+) -->$", re.MULTILINE)
TABLE = re.compile(r"^<!-- results table(?: (\S+))? -->$", re.MULTILINE)

log = logging.getLogger("mkdocs.hooks.benchmark_results")


def _summary():
    """benchmarks/summarize_results.py (the names and the table; it needs neither torch nor a GPU)."""
    spec = importlib.util.spec_from_file_location("benchmarks_summarize_results",
                                                  BENCHMARKS / "summarize_results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    sys.path.insert(0, str(BENCHMARKS))  # its own imports (_rows) lie beside it
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


summary = _summary()


def published() -> list[Path]:
    """The canonical CSVs and PNGs of benchmarks/results/, by name."""
    return sorted(p for p in summary.RESULTS.iterdir() if summary.parse_name(p.name) is not None)


def on_files(files, config):
    for path in published():
        files.append(File.generated(config, f"{SITE_FOLDER}/{path.name}", abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    here = posixpath.dirname(page.file.src_uri)
    names = [p.name for p in published()]

    def link(name: str) -> str:
        return posixpath.relpath(f"{SITE_FOLDER}/{name}", here or ".")

    def plots(match):
        prefix = match.group(1)
        chosen = [name for name in names if name.startswith(prefix) and name.endswith(".png")]
        if not chosen:
            log.warning(f"{page.file.src_uri}: no plot in benchmarks/results/ starts with {prefix!r}")
        return "\n\n".join(f"![{name}]({link(name)})" for name in chosen)

    def table(match):
        benchmark = match.group(1)
        if benchmark is not None and benchmark not in summary.BENCHMARKS:
            log.warning(f"{page.file.src_uri}: '<!-- results table {benchmark} -->' names no benchmark "
                        f"({', '.join(summary.BENCHMARKS)})")
            return ""
        runs = summary.table_rows(summary.RESULTS, benchmark=benchmark)
        if not runs:
            log.warning(f"{page.file.src_uri}: benchmarks/results/ holds no run"
                        + (f" of {benchmark}" if benchmark else ""))
            return ""
        return summary.table(runs, link=link)

    def figures(match):
        benchmark = match.group(1)
        text = summary.figures(benchmark, summary.RESULTS, link=link)
        if text is None:
            why = (f"benchmarks/results/ holds no {benchmark}_{summary.REFERENCE_GPU}_{summary.REFERENCE_RANKS}"
                   "ranks.csv with figures" if benchmark in summary.BENCHMARKS
                   else f"it names no benchmark ({', '.join(summary.BENCHMARKS)})")
            log.warning(f"{page.file.src_uri}: '<!-- figures {benchmark} -->' matches no data: {why}")
            return ""
        return text

    return PLOTS.sub(plots, FIGURES.sub(figures, TABLE.sub(table, markdown)))
