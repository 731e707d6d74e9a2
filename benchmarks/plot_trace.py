"""Render a Chrome trace JSON written by ``ctx.tracing.export`` to a PNG timeline (needs matplotlib).

One row per (rank, track), a bar per event with a duration, a tick per instant event, an arrow per
flow (signal or put -> the wait it released). For the docs: a picture of what Perfetto shows.

    python benchmarks/plot_trace.py trace.json trace.png [--title TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys

COLORS = {"compute": "#4c72b0", "store": "#dd8452", "put": "#dd8452", "get": "#55a868", "load": "#55a868",
          "signal": "#c44e52", "wait": "#8172b3", "copy": "#937860"}


def rows_of(events: list[dict], tracks_per_rank: int) -> dict[tuple[int, str], int]:
    """Row index of each (rank, track) shown: ranks in order, each rank's first ``tracks_per_rank`` tracks
    by number."""
    keys = sorted({(e["pid"], e["tid"]) for e in events if e.get("ph") in ("X", "i")},
                  key=lambda key: (key[0], _track_number(key[1])))
    shown = [key for key in keys if sum(1 for k in keys if k[0] == key[0] and k <= key) <= tracks_per_rank]
    return {key: i for i, key in enumerate(shown)}


def _track_number(track: str) -> int:
    digits = "".join(ch if ch.isdigit() else " " for ch in track).split()
    return int(digits[0]) if digits else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("png")
    parser.add_argument("--title", default="")
    parser.add_argument("--tracks", type=int, default=8, help="tracks (SMs or programs) shown per rank")
    args = parser.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_trace: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    with open(args.trace) as file:
        events = json.load(file)["traceEvents"]
    rows = rows_of(events, args.tracks)
    if not rows:
        print(f"plot_trace: {args.trace} has no events", file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(12, 1.2 + 0.35 * len(rows)))
    seen = set()
    for e in events:
        if e.get("ph") not in ("X", "i") or (e["pid"], e["tid"]) not in rows:
            continue
        row, color = rows[(e["pid"], e["tid"])], COLORS.get(e["name"], "#999999")
        label = None if e["name"] in seen else e["name"]
        seen.add(e["name"])
        if e["ph"] == "X":
            ax.barh(row, max(e.get("dur", 0), 0.001), left=e["ts"], height=0.7, color=color, label=label)
        else:
            ax.plot([e["ts"]], [row], marker="|", markersize=12, color=color, label=label)
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    for finish in (e for e in events if e.get("ph") == "f" and e["id"] in starts):
        start = starts[finish["id"]]
        if (start["pid"], start["tid"]) not in rows or (finish["pid"], finish["tid"]) not in rows:
            continue
        ax.annotate("", xy=(finish["ts"], rows[(finish["pid"], finish["tid"])]),
                    xytext=(start["ts"], rows[(start["pid"], start["tid"])]),
                    arrowprops=dict(arrowstyle="->", color="#444444", lw=0.8))
    ax.set_yticks(list(rows.values()), [f"rank {rank} · {track}" for rank, track in rows])
    ax.invert_yaxis()
    ax.set_xlabel("time (µs from the first event)")
    ax.set_title(args.title or args.trace)
    ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"plot_trace: {len(rows)} tracks -> {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
