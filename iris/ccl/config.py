"""``Config``: the knobs of a collective, checked when it is made."""

from __future__ import annotations

import enum
from dataclasses import dataclass

ALL_REDUCE_VARIANTS = ("one_shot", "two_shot", "atomic", "spinlock", "ring")
REDUCE_SCATTER_VARIANTS = ("two_shot",)


class ReduceOp(enum.Enum):
    """How all_reduce and reduce_scatter combine the ranks' values."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"


def _power_of_two(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value & (value - 1):
        raise ValueError(f"Config.{name}={value!r}: must be a power of two (an int >= 1)")


@dataclass
class Config:
    """Kernel parameters of the collectives in :mod:`iris.ccl`.

    Args:
        block_size: elements per program for the flat collectives (all_gather, broadcast, all_reduce).
        block_size_m, block_size_n: the tile of all_to_all, over (rows, columns of one rank's chunk).
        all_reduce_variant: "one_shot" (each rank reads every input), "two_shot" (each rank
            reduces one slice and sends it to all), "atomic" (atomic adds into every output),
            "spinlock" (locked read-modify-writes) or "ring" (neighbour to neighbour); None picks by
            size (see :func:`iris.ccl.all_reduce.choose_variant`).
        all_reduce_distribution: accepted for compatibility with the original API (0 or 1); unused.
        fused_bytes: a collective of at most this many bytes per rank (4 MiB) runs as one launch
            whose programs run the group's barriers themselves, instead of three launches (0:
            never). Measured on 2 x H200: fused is ahead up to 4 MiB, three launches from 64 MiB.
        reduce_scatter_variant: "two_shot", the only one.

    Example:
        >>> from iris.ccl import Config
        >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="two_shot"))
    """

    block_size: int = 1024
    block_size_m: int = 32
    block_size_n: int = 64
    all_reduce_variant: str | None = None
    all_reduce_distribution: int = 0
    reduce_scatter_variant: str = "two_shot"
    fused_bytes: int = 4 << 20

    def __post_init__(self):
        for name in ("block_size", "block_size_m", "block_size_n"):
            _power_of_two(name, getattr(self, name))
        if self.all_reduce_variant is not None and self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"Config.all_reduce_variant={self.all_reduce_variant!r}: use one of "
                             f"{', '.join(ALL_REDUCE_VARIANTS)}, or None to choose by size")
        if self.all_reduce_distribution not in (0, 1):
            raise ValueError(f"Config.all_reduce_distribution={self.all_reduce_distribution!r}: must be 0 or 1")
        if not isinstance(self.fused_bytes, int) or isinstance(self.fused_bytes, bool) or self.fused_bytes < 0:
            raise ValueError(f"Config.fused_bytes={self.fused_bytes!r}: must be an int >= 0")
        if self.reduce_scatter_variant not in REDUCE_SCATTER_VARIANTS:
            raise ValueError(f"Config.reduce_scatter_variant={self.reduce_scatter_variant!r}: use one of "
                             f"{', '.join(REDUCE_SCATTER_VARIANTS)}")
