"""How the benchmarks' result CSVs read: where the canonical runs are, which of them the docs' figures quote (the
reference platform), a cell as a number, a size as a label, and a ccl.py row's implementation and timing method.
Shared by benchmarks/summarize_results.py (the tables), benchmarks/claims.py (the figures pages quote) and
benchmarks/ccl.py (its tuner).

Example:
    >>> size_label(16 << 20), number("nan"), ccl_method({"impl": "nccl+graph", "note": ""})
    ('16 MiB', None, ('nccl', 'graph'))
"""

from __future__ import annotations

import math
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
COMMAND = "python benchmarks/summarize_results.py"
CCL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
REFERENCE_GPU = "nvidia-h200"  # the GPU kind and world size whose canonical CSVs the figures read
REFERENCE_RANKS = 2


def number(text) -> float | None:
    """A CSV cell as a number; None where it is empty or not a number (nan)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def size_label(nbytes: int) -> str:
    """``1024`` -> ``1 KiB``, ``16777216`` -> ``16 MiB``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} B"


def ccl_method(row: dict) -> tuple[str, str]:
    """(implementation, method) of a benchmarks/ccl.py CSV row: its ``method`` column (device, eager, graph or
    host). A CSV written before that column has none: there an impl named ``<impl>+graph`` was replayed from a
    graph (method graph), a row whose note is "host" is a host profile (method host), and every other row was
    timed with CUDA events around back-to-back calls (method device).

    Example:
        >>> ccl_method({"impl": "nccl+graph", "note": ""}), ccl_method({"impl": "iris", "method": "eager"})
        (('nccl', 'graph'), ('iris', 'eager'))
    """
    if row.get("method"):
        return row["impl"], row["method"]
    if row["impl"].endswith("+graph"):
        return row["impl"].removesuffix("+graph"), "graph"
    return row["impl"], "host" if row.get("note") == "host" else "device"


def ccl_times(rows: list[dict]) -> dict[tuple[str, str, int, str], float]:
    """{(method, collective, bytes, impl): µs} of the timed rows of a ccl.py CSV (host rows too; a row without a
    figure, such as a variant that cannot run at its size, is left out), in one dtype: bf16 where the CSV has it,
    else the first it names."""
    dtypes = list(dict.fromkeys(r.get("dtype", "") for r in rows if r.get("bytes", "").isdigit()
                                and int(r["bytes"]) > 0))
    dtype = "bf16" if "bf16" in dtypes else dtypes[0] if dtypes else ""
    times = {}
    for r in rows:
        us = number(r.get("us"))
        if us is not None and r.get("bytes", "").isdigit() and r.get("dtype", "") == dtype:
            impl, method = ccl_method(r)
            times[(method, r["collective"], int(r["bytes"]), impl)] = us
    return times
