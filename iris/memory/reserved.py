"""The heap's reserved tail: named regions that Iris itself uses, laid out once, the same on every rank.

Past the ``heap_size`` bytes that allocations may use, every rank's heap ends in a tail of
regions that other ranks reach by the same offset: the device barrier's arrival counters, the
collectives' lock words and ring flags. A :class:`ReservedLayout` is the one place that lays
them out; the heap hands out each region as a tensor (:meth:`iris.memory.heap.SymmetricHeap.region`).

Example:
    >>> layout = ReservedLayout([("barrier", 2 * 128, torch.int64), ("locks", 4096, torch.int32)])
    >>> layout.nbytes, layout.place("locks")
    (18432, (2048, 4096, torch.int32))
"""

from __future__ import annotations

import torch


class ReservedLayout:
    """Regions ``(name, count, dtype)`` one after another, each aligned to its element size."""

    def __init__(self, regions: list[tuple[str, int, torch.dtype]]):
        self._places: dict[str, tuple[int, int, torch.dtype]] = {}
        offset = 0
        for name, count, dtype in regions:
            if name in self._places:
                raise ValueError(f"reserved region {name!r} is laid out twice")
            size = torch.empty((), dtype=dtype).element_size()
            offset = -(-offset // size) * size
            self._places[name] = (offset, count, dtype)
            offset += count * size
        self.nbytes = offset

    def __contains__(self, name: str) -> bool:
        return name in self._places

    def place(self, name: str) -> tuple[int, int, torch.dtype]:
        """(offset in the tail, element count, dtype) of region ``name``."""
        try:
            return self._places[name]
        except KeyError:
            raise KeyError(f"no reserved region {name!r}; the layout has {sorted(self._places)}") from None
