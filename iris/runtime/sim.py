"""Simulation mode: several ranks share the GPUs there are.

With IRIS_SIMULATION=1 ranks may outnumber devices on purpose, and each rank writes its heap bases to
``{IRIS_HEAP_BASES_PREFIX or "iris"}_rank_{rank}_heap_bases.json`` for tools that replay or inspect a run.
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
