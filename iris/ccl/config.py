"""``Config``: the knobs of a collective, checked when it is made."""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

ALL_REDUCE_VARIANTS = ("one_shot", "two_shot", "atomic", "spinlock", "ring", "push", "ll", "hierarchical")
# The original's variants: "ring" and "persistent_inline" have their own paths (see iris.ccl.all_gather).
ALL_GATHER_VARIANTS = ("persistent", "partitioned", "ring", "persistent_inline")
REDUCE_SCATTER_VARIANTS = ("two_shot", "ring_chunked")
# Triton's cache modifiers: a load takes the first, a store the second ("" or None: the default).
LOAD_CACHE_MODIFIERS = (".ca", ".cg", ".cv")
STORE_CACHE_MODIFIERS = (".wb", ".cg", ".cs", ".wt")
CACHE_MODIFIERS = (None, "") + LOAD_CACHE_MODIFIERS + tuple(m for m in STORE_CACHE_MODIFIERS
                                                             if m not in LOAD_CACHE_MODIFIERS)


class _Autotune:
    """``iris.ccl.AUTOTUNE``: a Config field "to be tuned" (the original's API). Iris does not tune its
    collectives' knobs yet: such a field takes its default (the value measured best on 2 x H200)."""

    def __repr__(self):
        return "AUTOTUNE"


AUTOTUNE = _Autotune()


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
        block_size_m, block_size_n: the tile of all_to_all, over (rows, columns of one rank's chunk), and of
            reduce_scatter's same-shape layout.
        all_reduce_variant: "one_shot" (each rank reads every input), "two_shot" (each rank
            reduces one slice and sends it to all), "atomic" (atomic adds into every output),
            "spinlock" (locked read-modify-writes), "ring" (neighbour to neighbour), "push" (no
            barrier: inputs pushed into each member's landing zones, up to 1 MiB per rank; see
            :mod:`iris.ccl.all_reduce.push`), "ll" (push with each element beside its flag in one
            8-byte word: no fence, up to 32768 elements per rank, or 262144 of 16 bits two a word;
            same module), "hierarchical"
            (reduce-scatter inside each node, all_reduce across nodes, all_gather inside the node; see
            :mod:`iris.ccl.all_reduce.hierarchical`); None picks hierarchical for members on several
            nodes of the same size, else by size (see :func:`iris.ccl.all_reduce.choose_variant`).
        hierarchy: the node of each member, in the group's member order, for the hierarchical all_reduce,
            all_gather and reduce_scatter (:mod:`iris.ccl.hierarchy`)
            (e.g. ``(0, 0, 1, 1)``); None: the context's node map (``ctx.get_node_map()``). Any
            grouping may be given, e.g. pairs of GPUs on one switch.
        all_reduce_distribution: which member owns which tile in reduce_scatter's same-shape layout (see
            :mod:`iris.ccl.reduce_scatter`): 0 striding (tiles i, i + W, ...), 1 blocks of consecutive
            tiles (the original's newest default); all_reduce does not use it.
        fused_bytes: a collective of at most this many bytes per rank (4 MiB) runs as one launch
            whose programs run the group's barriers themselves, instead of three launches (0:
            never). Measured on 2 x H200: fused is ahead up to 4 MiB, three launches from 64 MiB.
        reduce_scatter_variant: "two_shot", or the original's "ring_chunked", run as two_shot
            (every member reads its part from every other directly: one step on NVLink's all-to-all
            links, where a ring takes W - 1); "ring_chunked" still makes and checks the original's
            workspace (:class:`iris.ccl.reduce_scatter.ReduceScatterWorkspace`).
        all_gather_variant: "persistent" (default) and "partitioned" run Iris's all_gather kernel,
            whose programs each write their piece to every member (so both are it); "ring" passes
            each member's blocks neighbour to neighbour (W - 1 steps, flags on the heap);
            "persistent_inline" is one launch that runs the group's barriers itself, whatever the size.
        cache_modifier: Triton's cache modifier for the all_gather stores (".wb", ".cg", ".cs",
            ".wt") and the reduce_scatter loads (".ca", ".cg", ".cv"); one that the access does not
            take is left out there (a hint, as in the original). None or "": the default.
        swizzle_size: the tile rows grouped together in reduce_scatter's tile numbering (the
            original's swizzle).

    Accepted for code written for the original, with no effect on how Iris runs (each says why):
        chunk_size: the original's grouping of programs per die; Iris's pieces are blocks.
            ``chunk_size`` None becomes ``min(swizzle_size ** 2, comm_sms // num_xcds)`` as there.
        comm_sms: the original's communication grid; Iris sizes each launch by the message.
        num_xcds: AMD's accelerator dies, for the original's swizzle; None becomes 1.
        use_gluon: the original's Gluon kernels; Iris runs its Triton kernels either way.
        all_reduce_num_rings, all_reduce_ring_slice_n: the original's ring shape (positive; the
            slice a power of two dividing block_size_n, default block_size_n); Iris's ring runs one
            ring per program.
        num_stages, num_warps, threads_per_warp (32 or 64), waves_per_eu: launch hints; Iris's
            collective kernels keep Triton's defaults.
    A field set to :data:`AUTOTUNE` takes its default; :meth:`autotune` makes such a Config.

    Example:
        >>> from iris.ccl import Config
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
    comm_sms: int = 64
    num_xcds: int | None = None
    chunk_size: int | None = None
    use_gluon: bool = False
    all_reduce_num_rings: int = 1
    all_reduce_ring_slice_n: int | None = None
    num_stages: int = 1
    num_warps: int = 4
    threads_per_warp: int = 64
    waves_per_eu: int = 0
    cache_modifier: str | None = None

    @classmethod
    def autotune(cls, **fixed) -> Config:
        """A Config with every field but ``fixed`` set to :data:`AUTOTUNE` (the original's API; see there).

        Example:
            >>> Config.autotune(comm_sms=64).block_size   # 1024: Iris does not tune yet
        """
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(fixed) - names
        if unknown:
            raise TypeError(f"Config.autotune: no such field {sorted(unknown)}")
        return cls(**{name: fixed.get(name, AUTOTUNE) for name in names})

    def _resolve_autotune(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is AUTOTUNE:
                setattr(self, f.name, f.default)

    def _check_compat_fields(self) -> None:
        if self.num_xcds is None:
            self.num_xcds = 1
        for name in ("swizzle_size", "comm_sms", "num_xcds", "all_reduce_num_rings", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Config.{name}={value!r}: must be a positive int")
        if self.chunk_size is None:
            self.chunk_size = min(self.swizzle_size ** 2, max(1, self.comm_sms // self.num_xcds))
        if self.all_reduce_ring_slice_n is None:
            self.all_reduce_ring_slice_n = self.block_size_n
        _power_of_two("all_reduce_ring_slice_n", self.all_reduce_ring_slice_n)
        if self.block_size_n % self.all_reduce_ring_slice_n:
            raise ValueError(f"Config.all_reduce_ring_slice_n={self.all_reduce_ring_slice_n}: must divide "
                             f"block_size_n={self.block_size_n}")
        if self.all_gather_variant not in ALL_GATHER_VARIANTS:
            raise ValueError(f"Config.all_gather_variant={self.all_gather_variant!r}: use one of "
                             f"{', '.join(ALL_GATHER_VARIANTS)}")
        if self.cache_modifier not in CACHE_MODIFIERS:
            raise ValueError(f"Config.cache_modifier={self.cache_modifier!r}: use one of "
                             f"{', '.join(repr(m) for m in CACHE_MODIFIERS)}")
        if self.threads_per_warp not in (32, 64):
            raise ValueError(f"Config.threads_per_warp={self.threads_per_warp!r}: must be 32 or 64")

    def __post_init__(self):
        self._resolve_autotune()
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
        self._check_compat_fields()
