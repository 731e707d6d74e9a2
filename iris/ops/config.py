"""``FusedConfig``: the knobs of the fused GEMM + communication operations, checked when made."""

from __future__ import annotations

from dataclasses import dataclass

from iris.ccl.config import ALL_REDUCE_VARIANTS

#: The cache modifiers Triton's loads take (the original's cache_modifier_a and cache_modifier_b).
LOAD_CACHE_MODIFIERS = (None, "", ".ca", ".cg", ".cv")


@dataclass
class FusedConfig:
    """Tile shape and launch options of :mod:`iris.ops`' fused kernels on a GPU.

    Triton's interpreter (the CPU backend) uses its own small tile instead (see iris.ops.gemm).

    Args:
        block_size_m, block_size_n, block_size_k: the GEMM tile; powers of two, at least 16.
        group_size_m: tile rows walked together (L2 reuse); a power of two.
        num_warps: warps per program (4 or 8 for these tiles); num_stages: pipeline depth (>= 1).
            With all six tile fields at their defaults, a call whose output has too few tiles to
            fill the SMs (decode-like M) takes a 128 x 128 tile, or a 64 x 128 one with 4 warps and
            4 stages, where its waves finish sooner (``iris.ops._fused.fitted_launch``); a tile set
            by hand is used as set.
        comm_programs: matmul_all_reduce and matmul_reduce_scatter only. 0 (default): every program
            computes its tiles and exchanges them itself. N > 0: workgroup specialization, N programs
            only exchange and sum the tiles the others compute and stage (not yet measured on a GPU).
        reduce_at_owner: matmul_all_reduce only, with comm_programs=0. True: owner-reduce: each
            tile's partials go to one owner (tiles' owners rotate over the members), which sums
            them and every other member reads the sum from it: about 2 (W - 1) / W tiles' bytes per rank
            and tile instead of W - 1. False: push-to-all: every member sends its partial to every
            other and each sums them all (one hop fewer). None (default): owner-reduce beyond 2 ranks.
        tma_loads: every fused op:
            load A and B tiles through TMA tensor descriptors (NVIDIA Hopper and newer; the
            interpreter too) where both are row-major with 16-byte aligned rows; else, and on AMD,
            masked loads. None (default): where this rank's A has at least 2048 rows
            (``iris.ops._fused.TMA_AUTO_ROWS``): on 2 x H200 the descriptors made the other four 7-18%
            faster at M >= 4096, and were mixed at M 1024 and slower at M 128-512.
            all_gather_matmul loads its own slice, B's, and the gathered slices (after their flags'
            acquire and an async-proxy fence: peers wrote them with ordinary stores) through
            descriptors; at one rank on one H200 they made it 9-11% faster at M 1024-16384.
        copy_engine: all_gather_matmul and the reduce ops. all_gather_matmul: False: the computing
            programs store A's pieces into every member between their tiles. True: after an entry barrier,
            A_shard goes to every member in one copy each, by the copy engine on a side stream (no SM), and
            then that member's arrival flag, while the kernel multiplies this rank's own slice; it needs a
            contiguous A_shard and one GPU per rank inside one node. None (default): by copies where
            A_shard has at most 1024 rows (``iris.ops.all_gather_matmul.kernel.COPY_ENGINE_AUTO_ROWS``) and the job
            and A_shard allow it, else by the programs: on 2 x H100 the copies were 3-8% faster at M
            128-1024 and 4-8% slower at M 4096-16384 (benchmarks/ops.py's all_gather_matmul sweep, run with
            ``--config copy_engine=1`` and ``copy_engine=0``).
            matmul_reduce_scatter and matmul_all_reduce: True: one launch computes this rank's partials
            of the other members' N / W columns, copies send them to their owners by row chunks, and a
            second launch computes this rank's own columns and adds the members' partials as their chunks
            arrive (all_reduce: and stores its sums on every other member)
            (:mod:`iris.ops.matmul_all_reduce.copy_engine`;
            N divisible by W); False: the programs push every partial tile (:mod:`iris.ops.matmul_all_reduce.kernel`);
            None (default): at 2 ranks, by copies where a member's N / W columns have more tiles than one
            wave of programs and the job allows copies (on 2 x H100 0-8% faster from M 1024 N 14336 on,
            6-27% slower within one wave); beyond 2 ranks (not measured yet) the pushes. The other ops: no
            effect.
        vendor_gemm: all_gather_matmul and matmul_all_reduce. all_gather_matmul: True: the vendor's GEMM
            (cuBLAS or hipBLASLt, through torch) multiplies instead of Iris's kernel: A_shard goes to every
            member by copies with an arrival flag, as with copy_engine=True, while torch multiplies this rank's
            own slice (and adds the bias); then each member's slice is multiplied and added into output once
            its flag is seen
            (:mod:`iris.ops.all_gather_matmul.vendor_gemm`). Needs what the copies need (a contiguous A_shard, one GPU
            per rank,
            one node) and an output of A's dtype; refused before any launch otherwise (and with
            copy_engine=False). Each member's product is rounded to output's dtype before the next is added; the
            tile fields, tma_loads and split_k have no effect. False: Iris's kernel. None (default): the vendor's
            GEMM where copy_engine, tma_loads and split_k are unset, A is bfloat16 or float16, output has A's dtype
            and the copies can go, else Iris's kernel (``iris.ops.all_gather_matmul.kernel.takes_vendor_gemm``): on 2
            x H100
            it was 1.01x-1.30x of torch's fused op at every shape of the sweep, Iris's kernel 0.96x-1.30x.
            matmul_all_reduce: True: as the pipeline of row chunks (``pipeline_chunks``, 4 where unset), torch's
            GEMM computing each chunk's partial instead of Iris's (:mod:`iris.ops.matmul_all_reduce.pipelined`); an
            output of A's
            dtype; refused where the fused kernel is asked for. None and False: as ``pipeline_chunks`` says,
            with Iris's GEMM (on 2 x H100 the vendor's pipeline was slower than the fused kernel at 9 of 10
            shapes; on 4 x H100 7-26% slower than the pipeline by Iris's GEMM from 8192 rows, and at 4096 rows
            2-9% faster than the fused kernel but below torch + NCCL either way; 8 ranks not measured). The other
            ops: no effect.
        split_k: matmul_all_gather and gemm_all_scatter: S > 1: each output tile's product over K is
            cut into S parts computed by S programs; the last one adds the others' parts (handed over
            through a local workspace) and stores the tile, so an output of few tiles still fills the
            SMs. Loads without tensor descriptors (not with tma_loads=True). None (default): on a GPU, 1, 2
            or 4, whichever ``iris.ops._fused.fitted_launch`` expects to finish soonest with the default
            tile where the output has at least 256 rows (on 2 x H100: 2 parts at 256 x 8192, 7-14% faster
            than half tiles), with the small tile below (2 parts at 64 x 8192 and 128 x 4096); where that
            splits no tile, the last round's tiles in 2 or 4 parts where they finish it sooner
            (``iris.ops._fused.split_last_round``); 1 on the CPU backend.
            all_gather_matmul: the last round's tiles (the last tile on the CPU backend's one program) in
            S parts by member slice, at most one per member. None (default): the parts that finish the
            last round soonest from 256 rows (``iris.ops.all_gather_matmul.kernel.last_round``: 2 where 64 tiles of the
            default tile are left for 128 programs); none on the CPU backend.
        pipeline_chunks: matmul_all_reduce only. C >= 1: no fused kernel; Iris's GEMM computes this rank's
            partial product C row chunks at a time, leaving some SMs free, and each chunk is summed over the
            ranks by ``iris.ccl.all_reduce`` on a side stream as soon as it is computed
            (:mod:`iris.ops.matmul_all_reduce.pipelined`). Not with comm_programs, reduce_at_owner=True or
            copy_engine=True.
            0: the fused kernel. None (default): 4 chunks from 4 ranks (one GPU each, one node) and 8192 output
            rows, unless comm_programs, reduce_at_owner or copy_engine is given, or an all_reduce_variant other
            than two_shot or hierarchical (on 4 x H100 4-22% faster than the fused kernel at M 16384, slower
            at M 1024 and at 2 ranks); else the fused kernel. The other ops: no effect.
        pipeline_comm_sms: matmul_all_reduce's pipeline by Iris's GEMM only: the SMs its GEMM leaves free for the
            chunks' sums (N >= 1); None (default): 16, or 8 where this rank's K is 3072 or more (the GEMM about as
            long as the sums; ``iris.ops.matmul_all_reduce.pipelined.gemm_programs``; on 4 x H100 6-10% faster there
            than 16, which
            was the fastest of 4-48 at K 2048). Not with pipeline_chunks=0.
        all_reduce_variant: the original's choice of the all-reduce inside matmul_all_reduce: None,
            "one_shot" or "two_shot" as in the original's newest release (which refuses its older "atomic",
            "spinlock" and "ring" there, and so does Iris, before any launch), or Iris's "push", "ll",
            "hierarchical". Where matmul_all_reduce runs as a pipeline (pipeline_chunks), the variant that
            sums each chunk in place (two_shot, push, ll or hierarchical; another raises ValueError before
            any launch); None: iris.ccl's choice by size. Iris's fused kernel exchanges its tiles itself:
            there it has no effect.

    The original's newest fields, accepted so that code written for it runs; they tune the original's
    AMD kernels and change nothing in Iris's (each is checked, and kept on the config):

        num_sms: the persistent programs of the original's GEMM (None: one per SM). Iris sizes its grid
            itself, one program per SM of this rank's share (``iris.ops._fused.concurrent_programs``).
        num_xcds, chunk_size: the XCD count and chunk of the original's chiplet-aware tile order
            (>= 1; 1 and 1 by default). ``iris.get_num_xcc()`` gives a device's count.
        cache_modifier_a, cache_modifier_b: the cache modifier of the original's loads of A and B
            (None, "", ".ca", ".cg" or ".cv"; ".ca" by default).
        allow_tf32: whether the original's float32 GEMM may use TF32 (True by default; Iris's float32
            ``tl.dot`` takes Triton's default precision).
        all_reduce_num_rings: rings of the original's ring all-reduce (>= 1; 1 by default).
        reduce_num_sms: programs of the original's reduce-scatter communication kernels (>= 1; 64).
        ksplit: the original's K-split partitioning (False by default).

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
    num_sms: int | None = None
    num_xcds: int = 1
    chunk_size: int = 1
    cache_modifier_a: str | None = ".ca"
    cache_modifier_b: str | None = ".ca"
    allow_tf32: bool = True
    all_reduce_num_rings: int = 1
    reduce_num_sms: int = 64
    ksplit: bool = False

    def validate(self, world_size: int | None = None) -> None:
        """Check the fields again (they were checked when the config was made; a field changed since is
        checked now), and with ``world_size``, that the original's ring all-reduce can split a tile's
        ``block_size_n`` columns over the ranks.

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
        self._check_original_fields()
        if self.all_reduce_variant is not None and self.all_reduce_variant not in ALL_REDUCE_VARIANTS:
            raise ValueError(f"FusedConfig.all_reduce_variant={self.all_reduce_variant!r}: use None or one of "
                             f"{', '.join(ALL_REDUCE_VARIANTS)}")
        for name in ("block_size_m", "block_size_n", "block_size_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 16 or value & (value - 1):
                raise ValueError(f"FusedConfig.{name}={value!r}: must be a power of two >= 16 (tl.dot's minimum)")
        for name, low, optional in (("group_size_m", 1, False), ("num_warps", 1, False), ("num_stages", 1, False),
                                    ("comm_programs", 0, False), ("split_k", 1, True), ("pipeline_chunks", 0, True),
                                    ("pipeline_comm_sms", 1, True)):
            value = getattr(self, name)
            if optional and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                either = "None or " if optional else ""
                raise ValueError(f"FusedConfig.{name}={value!r}: must be {either}an int >= {low}")
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

    def _check_original_fields(self) -> None:
        """The original's newest fields (hints here): the types and ranges it allows."""
        for name, low, optional in (("num_sms", 1, True), ("num_xcds", 1, False), ("chunk_size", 1, False),
                                    ("all_reduce_num_rings", 1, False), ("reduce_num_sms", 1, False)):
            value = getattr(self, name)
            if optional and value is None:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                either = "None or " if optional else ""
                raise ValueError(f"FusedConfig.{name}={value!r}: must be {either}an int >= {low}")
        for name in ("cache_modifier_a", "cache_modifier_b"):
            value = getattr(self, name)
            if value not in LOAD_CACHE_MODIFIERS:
                raise ValueError(f"FusedConfig.{name}={value!r}: must be one of "
                                 f"{', '.join(map(repr, LOAD_CACHE_MODIFIERS))}")
        for name in ("allow_tf32", "ksplit"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FusedConfig.{name}={getattr(self, name)!r}: must be True or False")
