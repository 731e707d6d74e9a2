"""Simulation mode: several ranks share the GPUs there are.

With IRIS_SIMULATION=1 (also true/yes) ranks are placed on ``rank % device_count``
(the backends always do this; simulation only lets ranks outnumber devices on
purpose) and every rank writes ``{IRIS_HEAP_BASES_PREFIX or "iris"}_rank_{rank}_heap_bases.json``
with its rank, the world size and the heap bases in hex, for tools that replay
or inspect a run.
"""

from __future__ import annotations

import json

from iris import config


def heap_bases_path(rank: int) -> str:
    return f"{config.heap_bases_prefix()}_rank_{rank}_heap_bases.json"


def write_heap_bases(rank: int, num_ranks: int, bases: list[int]) -> str:
    """Write this rank's heap-bases JSON file; returns its path."""
    path = heap_bases_path(rank)
    with open(path, "w") as f:
        json.dump({"rank": rank, "num_ranks": num_ranks, "heap_bases": [hex(b) for b in bases]}, f, indent=2)
    return path
