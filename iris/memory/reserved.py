"""The heap's reserved tail: named regions Iris itself uses, past the bytes allocations may use, at the same
offset on every rank. Collectives declare their scratch (:class:`Region`) in their own modules when
imported; the team lays the declared regions out (:func:`iris.host.team.reserved_layout`) and hands each
out by name (``ctx.team.region(name)``).

Example:
    >>> declare(Region("my_op.flags", 128, torch.int64, order=100))   # a collective's module, at import
    >>> ReservedLayout([("barrier", 256, torch.int64), ("locks", 4096, torch.int32)]).place("locks")
    (2048, 4096, torch.int32)
"""

from __future__ import annotations

import dataclasses

import torch

LIFETIMES = ("context", "call")


@dataclasses.dataclass(frozen=True)
class Region:
    """A collective's scratch: ``count`` elements of ``dtype`` (times the team's size with ``per_rank``).

    ``lifetime`` "context": state kept from call to call, zeroed when the team is made; "call": written
    before it is read in each call, never zeroed. ``on_heap`` False: this rank's own memory, not in the
    tail. ``order``: its place in the tail (lower first), so the layout never depends on import order.
    ``alignment``: bytes (0: the element size)."""

    name: str
    count: int
    dtype: torch.dtype
    order: int = 0
    per_rank: bool = False
    lifetime: str = "context"
    on_heap: bool = True
    alignment: int = 0

    def __post_init__(self):
        if self.lifetime not in LIFETIMES:
            raise ValueError(f"Region.lifetime={self.lifetime!r}: one of {LIFETIMES}")

    @property
    def zeroed(self) -> bool:
        return self.lifetime == "context"

    def elements(self, world_size: int) -> int:
        return self.count * world_size if self.per_rank else self.count


_DECLARED: dict[str, Region] = {}


def declare(*regions: Region) -> tuple[Region, ...]:
    """Add ``regions`` to every team made from now on (again: nothing changes); returns them."""
    for region in regions:
        known = _DECLARED.setdefault(region.name, region)
        if known != region:
            raise ValueError(f"reserved region {region.name!r} is declared twice, differently: {known} and {region}")
    return regions


def declared() -> tuple[Region, ...]:
    """Every declared region, in tail order."""
    return tuple(sorted(_DECLARED.values(), key=lambda region: (region.order, region.name)))


class ReservedLayout:
    """Regions ``(name, count, dtype[, alignment])`` one after another, each aligned to ``alignment`` bytes
    (default: its element size)."""

    def __init__(self, regions: list[tuple]):
        self._places: dict[str, tuple[int, int, torch.dtype]] = {}
        offset = 0
        for name, count, dtype, *alignment in regions:
            if name in self._places:
                raise ValueError(f"reserved region {name!r} is laid out twice")
            size = torch.empty((), dtype=dtype).element_size()
            align = alignment[0] if alignment and alignment[0] else size
            offset = -(-offset // align) * align
            self._places[name] = (offset, count, dtype)
            offset += count * size
        self.nbytes = offset

    def __contains__(self, name: str) -> bool:
        return name in self._places

    def names(self) -> list[str]:
        """The regions' names, in tail order."""
        return list(self._places)

    def place(self, name: str) -> tuple[int, int, torch.dtype]:
        """(offset in the tail, element count, dtype) of region ``name``."""
        try:
            return self._places[name]
        except KeyError:
            raise KeyError(f"no reserved region {name!r}; the layout has {sorted(self._places)}") from None
