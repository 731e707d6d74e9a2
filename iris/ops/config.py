"""``FusedConfig``: the knobs of the fused GEMM + communication operations, checked when made."""

from __future__ import annotations

from dataclasses import dataclass

from iris.ccl.config import ALL_REDUCE_VARIANTS


def check_counts(config, counts) -> None:
    """Each ``(name, low, optional)`` of ``counts``: ``config``'s field ``name`` is an int >= ``low`` (or None where
    ``optional``), else ValueError naming the field and the value."""
    for name, low, optional in counts:
        value = getattr(config, name)
        if optional and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            either = "None or " if optional else ""
            raise ValueError(f"FusedConfig.{name}={value!r}: must be {either}an int >= {low}")


@dataclass
class FusedConfig:
    """Tile shape and launch options of :mod:`iris.ops`' fused kernels on a GPU (Triton's interpreter runs one
    small tile of its own: iris.ops.gemm). Defaults marked "measured" were chosen by benchmarks/ops.py on H100s.

    Args:
        block_size_m, block_size_n, block_size_k: the GEMM tile; powers of two, at least 16.
        group_size_m: tile rows walked together (L2 reuse); a power of two.
        num_warps: warps per program (4 or 8 for these tiles); num_stages: pipeline depth (>= 1). With all
            six tile fields at their defaults, an output with too few tiles to fill the SMs takes a 128 x 128
            or 64 x 128 tile where its waves finish sooner (``iris.ops._fused.fitted_launch``).
        comm_programs: matmul_all_reduce and matmul_reduce_scatter. 0 (default): every program exchanges its
            own tiles; N > 0: N programs only exchange and sum the tiles the others compute.
        reduce_at_owner: matmul_all_reduce with comm_programs=0. True: each tile's partials go to one owner
            (rotating), which sums them for the others to read; False: every member sends its partial to every
            other and sums them all. None (default): owner-reduce beyond 2 ranks.
        tma_loads: load A and B tiles through TMA tensor descriptors (NVIDIA, and the interpreter) where both
            are row-major with 16-byte aligned rows; else masked loads. None (default): from 2048 rows of A
            (``iris.ops._fused.TMA_AUTO_ROWS``, measured).
        copy_engine: all_gather_matmul: True: A_shard goes to every member in one copy each on a side stream
            (no SM), then its arrival flag, while the kernel multiplies this rank's own slice (a contiguous
            A_shard, one GPU per rank, one node); False: the programs store A's pieces between their tiles;
            None (default): by copies up to 1024 rows (``COPY_ENGINE_AUTO_ROWS``, measured) where allowed.
            matmul_reduce_scatter and matmul_all_reduce: True: this rank's partials of the other members' N / W
            columns go to their owners by copies, in row chunks, which add them into their own columns
            (:mod:`iris.ops.matmul_all_reduce.copy_engine`; N divisible by W); False: the programs push every
            partial tile; None (default): at 2 ranks by copies where a member's columns take more than one wave
            of programs (measured), else the pushes. matmul_all_gather: True: each block of output rows goes to
            every member by copies its tiles trigger as they finish (:mod:`iris.host.triggered`: the copy engine
            on GPUs, no SM stores to peers; not measured yet); None or False (default): the programs store each
            tile into every member.
        vendor_gemm: all_gather_matmul: True: torch's GEMM (cuBLAS, hipBLASLt) multiplies each member's slice
            once its copy's flag is seen (:mod:`iris.ops.all_gather_matmul.vendor_gemm`): what the copies need,
            an output of A's dtype; the tile fields, tma_loads and split_k have no effect. None (default): where
            copy_engine, tma_loads and split_k are unset, A is 16-bit and the copies can go
            (``takes_vendor_gemm``, measured). matmul_all_reduce: True: the pipeline of row chunks
            (``pipeline_chunks``, 4 where unset) with torch's GEMM; refused where the fused kernel is asked for.
        split_k: matmul_all_gather and gemm_all_scatter: S > 1: each output tile's K is cut in S parts by S
            programs, the last adding the others' parts, so that few tiles still fill the SMs (not with
            tma_loads=True). None (default): the parts that finish soonest (``fitted_launch``,
            ``split_last_round``); 1 on the CPU backend. all_gather_matmul: the last round's tiles in S parts
            by member slice (at most one per member); None: ``all_gather_matmul.kernel.last_round``.
        pipeline_chunks: matmul_all_reduce. C >= 1: Iris's GEMM computes the partial product C row chunks at a
            time, leaving some SMs free, and ``iris.ccl.all_reduce`` sums each chunk on a side stream
            (:mod:`iris.ops.matmul_all_reduce.pipelined`; not with comm_programs, reduce_at_owner=True or
            copy_engine=True). 0: the fused kernel. None (default): 4 chunks from 4 ranks (one GPU each, one
            node) and 8192 rows unless a mode of the fused kernel or a variant that cannot sum in place is
            given (measured); else the fused kernel.
        pipeline_comm_sms: the SMs the pipeline's GEMM leaves to the chunks' sums (>= 1); None (default): 16, or
            8 from K 3072 (``pipelined.gemm_programs``, measured). Not with pipeline_chunks=0.
        all_reduce_variant: the all-reduce that sums the pipeline's chunks in place: None (iris.ccl's choice by
            size), "two_shot", "push", "ll" or "hierarchical" (another raises ValueError before any launch with
            pipeline_chunks given, and keeps the fused kernel by default); "atomic", "spinlock" and "ring" are
            refused. The fused kernel exchanges its tiles itself: there it has no effect.

    Example:
        >>> from iris.ops import FusedConfig
        >>> ctx.ops.matmul_all_reduce(out, a, b, config=FusedConfig(block_size_n=128))
    """

    block_size_m: int = 128
    block_size_n: int = 256
    block_size_k: int = 64
    group_size_m: int = 8
    num_warps: int = 8
    num_stages: int = 3
    comm_programs: int = 0
    reduce_at_owner: bool | None = None
    tma_loads: bool | None = None
    all_reduce_variant: str | None = None
    copy_engine: bool | None = None
    split_k: int | None = None
    pipeline_chunks: int | None = None
    vendor_gemm: bool | None = None
    pipeline_comm_sms: int | None = None

    def validate(self, world_size: int | None = None) -> None:
        """Check the fields again (they were checked when the config was made; a field changed since is
        checked now), and with ``world_size``, that a ring all-reduce could split a tile's ``block_size_n``
        columns over the ranks.

        Raises:
            ValueError: naming the field and its value.

        Example:
            >>> FusedConfig(all_reduce_variant="ring").validate(world_size=ctx.get_num_ranks())
        """
        self.__post_init__()
        if self.all_reduce_variant == "ring" and world_size and self.block_size_n % world_size:
            raise ValueError(f"FusedConfig(all_reduce_variant='ring', block_size_n={self.block_size_n}): the ring "
                             f"splits a tile's columns over {world_size} ranks; give a multiple of {world_size}")

    def __post_init__(self):
        if self.all_reduce_variant is not None and self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"FusedConfig.all_reduce_variant={self.all_reduce_variant!r}: use None or one of "
                             f"{', '.join(ALL_REDUCE_VARIANTS)}")
        for name in ("block_size_m", "block_size_n", "block_size_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 16 or value & (value - 1):
                raise ValueError(f"FusedConfig.{name}={value!r}: must be a power of two >= 16 (tl.dot's minimum)")
        check_counts(self, (("group_size_m", 1, False), ("num_warps", 1, False), ("num_stages", 1, False),
                            ("comm_programs", 0, False), ("split_k", 1, True), ("pipeline_chunks", 0, True),
                            ("pipeline_comm_sms", 1, True)))
        for name in ("group_size_m", "num_warps"):
            value = getattr(self, name)
            if value & (value - 1):
                raise ValueError(f"FusedConfig.{name}={value!r}: must be a power of two")
        for name in ("tma_loads", "vendor_gemm", "copy_engine", "reduce_at_owner"):
            if not isinstance(getattr(self, name), (bool, type(None))):
                raise ValueError(f"FusedConfig.{name}={getattr(self, name)!r}: must be None, True or False")
        if self.vendor_gemm and self.copy_engine is False:
            raise ValueError("FusedConfig(vendor_gemm=True and copy_engine=False): the vendor's GEMM takes A's slices "
                             "from copies, not from the programs' pushes; pass one or the other")
        if self.split_k is not None and self.split_k > 1 and self.tma_loads:
            raise ValueError(f"FusedConfig(split_k={self.split_k} and tma_loads=True): the K parts load without "
                             "tensor descriptors; pass one or the other")
        if self.pipeline_comm_sms is not None and self.pipeline_chunks == 0:
            raise ValueError(f"FusedConfig(pipeline_chunks=0 and pipeline_comm_sms={self.pipeline_comm_sms}): the "
                             "fused kernel runs, not the pipeline whose GEMM leaves those SMs; pass one or the other")
        if self.pipeline_comm_sms is not None and self.vendor_gemm:
            raise ValueError(f"FusedConfig(vendor_gemm=True and pipeline_comm_sms={self.pipeline_comm_sms}): the "
                             "vendor's GEMM takes every SM; the SMs left free are Iris's GEMM's; pass one or the other")
        for name in ("comm_programs", "reduce_at_owner"):
            if self.pipeline_chunks and getattr(self, name):
                raise ValueError(f"FusedConfig(pipeline_chunks={self.pipeline_chunks} and {name}="
                                 f"{getattr(self, name)!r}): the pipeline's chunks are summed by iris.ccl.all_reduce, "
                                 "not by the fused kernel; pass one or the other")
        if self.reduce_at_owner and self.comm_programs:
            raise ValueError(f"FusedConfig(reduce_at_owner=True and comm_programs={self.comm_programs}): "
                             "communication programs push every tile to every member; pass one or the other")
