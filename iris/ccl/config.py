"""``Config``: the knobs of a collective, checked when it is made."""

from __future__ import annotations

import enum
from dataclasses import dataclass

ALL_REDUCE_VARIANTS = ("one_shot", "two_shot", "atomic", "spinlock", "ring", "push", "ll", "hierarchical")
ALL_GATHER_VARIANTS = ("persistent", "partitioned", "ring", "persistent_inline", "copies")
REDUCE_SCATTER_VARIANTS = ("two_shot", "ring_chunked")
ALL_TO_ALL_VARIANTS = ("persistent", "copies")
# Triton's cache modifiers: a load takes the first, a store the second ("" or None: the default).
LOAD_CACHE_MODIFIERS = (".ca", ".cg", ".cv")
STORE_CACHE_MODIFIERS = (".wb", ".cg", ".cs", ".wt")
CACHE_MODIFIERS = (None, "") + LOAD_CACHE_MODIFIERS + tuple(m for m in STORE_CACHE_MODIFIERS
                                                             if m not in LOAD_CACHE_MODIFIERS)


class ReduceOp(enum.Enum):
    """How all_reduce and reduce_scatter combine the ranks' values."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"


def _power_of_two(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value & (value - 1):
        raise ValueError(f"Config.{name}={value!r}: must be a power of two (an int >= 1)")


@dataclass
class CollectiveConfig:
    """Kernel parameters of the collectives in :mod:`iris.ccl`, checked when made (a bad value raises ValueError).

    Args:
        block_size: elements per program of the flat collectives (all_gather, broadcast, all_reduce).
        block_size_m, block_size_n: the tile of all_to_all and of reduce_scatter's tiled layout.
        all_reduce_variant: one of ALL_REDUCE_VARIANTS (:mod:`iris.ccl.all_reduce`); None: by size and nodes.
        hierarchy: the node of each member in member order, e.g. ``(0, 0, 1, 1)``, for the hierarchical
            collectives (:mod:`iris.ccl.hierarchy`); None: ``ctx.get_node_map()``.
        all_reduce_distribution, swizzle_size: reduce_scatter's tiled layout: tiles owned striding (0) or in
            runs (1), numbered in bands of ``swizzle_size`` tile rows (:mod:`iris.ccl.reduce_scatter`).
        fused_bytes: up to this many bytes per rank, one launch that runs the group's barriers itself (0: never).
        reduce_scatter_variant: "two_shot" (direct reads), or "ring_chunked": the same, keeping a per-tile flags
            workspace in the tiled layout (:class:`iris.ccl.reduce_scatter.ReduceScatterWorkspace`).
        all_gather_variant: one of ALL_GATHER_VARIANTS (:mod:`iris.ccl.all_gather`).
        cache_modifier: Triton's cache modifier of the all_gather stores or the reduce_scatter loads, left out
            where the access does not take it; None or "": the default.
        all_to_all_variant: "persistent" (a kernel stores every block into its member's output) or "copies"
            (the copy engine, no SM: :mod:`iris.ccl.all_to_all`).

    Example:
        >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="two_shot"))
    """

    block_size: int = 1024
    block_size_m: int = 32
    block_size_n: int = 64
    all_reduce_variant: str | None = None
    hierarchy: tuple[int, ...] | None = None
    all_reduce_distribution: int = 1
    reduce_scatter_variant: str = "two_shot"
    fused_bytes: int = 4 << 20
    all_gather_variant: str = "persistent"
    swizzle_size: int = 4
    cache_modifier: str | None = None
    all_to_all_variant: str = "persistent"

    def __post_init__(self):
        for name in ("block_size", "block_size_m", "block_size_n"):
            _power_of_two(name, getattr(self, name))
        if self.all_reduce_variant is not None and self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"Config.all_reduce_variant={self.all_reduce_variant!r}: use one of "
                             f"{', '.join(ALL_REDUCE_VARIANTS)}, or None to choose by size")
        if self.hierarchy is not None:
            if not isinstance(self.hierarchy, (tuple, list)) or not all(
                    isinstance(node, int) and not isinstance(node, bool) and node >= 0 for node in self.hierarchy):
                raise ValueError(f"Config.hierarchy={self.hierarchy!r}: give one node number (an int >= 0) per "
                                 "member, e.g. (0, 0, 1, 1), or None for the context's node map")
            self.hierarchy = tuple(self.hierarchy)
        if self.all_reduce_distribution not in (0, 1):
            raise ValueError(f"Config.all_reduce_distribution={self.all_reduce_distribution!r}: must be 0 or 1")
        if not isinstance(self.fused_bytes, int) or isinstance(self.fused_bytes, bool) or self.fused_bytes < 0:
            raise ValueError(f"Config.fused_bytes={self.fused_bytes!r}: must be an int >= 0")
        if self.reduce_scatter_variant not in REDUCE_SCATTER_VARIANTS:
            raise ValueError(f"Config.reduce_scatter_variant={self.reduce_scatter_variant!r}: use one of "
                             f"{', '.join(REDUCE_SCATTER_VARIANTS)}")
        if not isinstance(self.swizzle_size, int) or isinstance(self.swizzle_size, bool) or self.swizzle_size < 1:
            raise ValueError(f"Config.swizzle_size={self.swizzle_size!r}: must be a positive int")
        if self.all_gather_variant not in ALL_GATHER_VARIANTS:
            raise ValueError(f"Config.all_gather_variant={self.all_gather_variant!r}: use one of "
                             f"{', '.join(ALL_GATHER_VARIANTS)}")
        if self.all_to_all_variant not in ALL_TO_ALL_VARIANTS:
            raise ValueError(f"Config.all_to_all_variant={self.all_to_all_variant!r}: use one of "
                             f"{', '.join(ALL_TO_ALL_VARIANTS)}")
        if self.cache_modifier not in CACHE_MODIFIERS:
            raise ValueError(f"Config.cache_modifier={self.cache_modifier!r}: use one of "
                             f"{', '.join(repr(m) for m in CACHE_MODIFIERS)}")


#: The public name (``iris.ccl.Config``); :func:`iris.compat.install` puts a subclass with more (no-op) fields in its
#: place. Native code names :class:`CollectiveConfig`, so the configs it makes and checks stay this class.
Config = CollectiveConfig
