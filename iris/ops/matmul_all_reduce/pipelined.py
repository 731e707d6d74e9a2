"""``matmul_all_reduce`` as a pipeline of row chunks: ``FusedConfig(pipeline_chunks=C)``.

Iris's GEMM (:func:`iris.ops.gemm.matmul`) computes this rank's partial product C row chunks at a time into a
heap buffer, leaving some SMs free (:func:`gemm_programs`), and each chunk is summed in place by
``iris.ccl.all_reduce`` and copied into the output on a side stream while the next chunks compute. Launches,
in stream order: a barrier, per chunk its GEMM and the fork of its sum, then the join: the output is complete
in stream order after the call. ``vendor_gemm=True``: torch's GEMM computes each chunk, on every SM.

Why: where the all_reduce takes longer than the GEMM, the fused kernel's SMs take about the sum of both; here
they run side by side. Measured faster from 4 ranks and 4096 rows only, which ``pipeline_chunks=None`` takes
(:func:`chunks`).

Example:
    >>> ctx.ops.matmul_all_reduce(out, A_shard, B_shard, config=FusedConfig(pipeline_chunks=4))
"""

from __future__ import annotations

import torch

from iris.ccl.all_reduce import BARRIER_FREE, IN_PLACE
from iris.ccl.config import Config
from iris.host.replay import weakly_held
from iris.ops import _fused
from iris.ops.config import FusedConfig
from iris.ops.gemm import matmul

# SMs the GEMM leaves to the chunks' all_reduce (FusedConfig.pipeline_comm_sms None): fewer where this rank's K
# is deep (its GEMM as long as the sums or longer), as measured on H100s
COMM_SMS = 16
DEEP_K = 3072
DEEP_K_COMM_SMS = 8
# FusedConfig.pipeline_chunks None: BY_DEFAULT_CHUNKS chunks from this many ranks and output rows (measured)
BY_DEFAULT_RANKS = 4
BY_DEFAULT_ROWS = 4096
BY_DEFAULT_CHUNKS = 4
# all_reduce variants (None: iris.ccl's choice) that sum a chunk of any size in place: iris.ccl's in-place ones
# but those bounded by a landing zone; the others keep pipeline_chunks=None on the fused kernel
ANY_CHUNK_IN_PLACE = (None, *(variant for variant in IN_PLACE if variant not in BARRIER_FREE))


def default_chunks(world: int, rows: int) -> int:
    """The chunks ``pipeline_chunks=None`` takes for ``world`` ranks and an output of ``rows`` rows where nothing
    else stands in the way (see :func:`chunks`); 0: the fused kernel.

    Example:
        >>> default_chunks(4, 4096), default_chunks(2, 16384), default_chunks(4, 1024)
        (4, 0, 0)
    """
    return BY_DEFAULT_CHUNKS if world >= BY_DEFAULT_RANKS and rows >= BY_DEFAULT_ROWS else 0


def chunks(ctx, config: FusedConfig, A) -> int:
    """How many row chunks this matmul_all_reduce call pipelines by; 0: the fused kernel.

    ``config.pipeline_chunks`` where given. None: :data:`BY_DEFAULT_CHUNKS` with ``vendor_gemm=True``; else
    :func:`default_chunks`, but the fused kernel where nothing runs beside it (no streams: the CPU backend),
    where ranks share a GPU or a member is on another node (measured: one GPU per rank, one node), where a mode
    of the fused kernel is asked for, and where ``all_reduce_variant`` cannot sum every chunk in place.
    """
    if config.pipeline_chunks is not None:
        return config.pipeline_chunks
    if config.vendor_gemm:  # the vendor's GEMM runs only in the pipeline
        return BY_DEFAULT_CHUNKS
    if fused_kernel_asked_for(config) or not ctx.team.backend.has_streams or _fused.copy_refusal(ctx) is not None:
        return 0
    return default_chunks(ctx.get_num_ranks(), A.shape[0])


def fused_kernel_asked_for(config: FusedConfig) -> bool:
    """Whether ``config`` (its pipeline_chunks None) keeps matmul_all_reduce on the fused kernel wherever it is:
    a mode of the fused kernel given, or an all_reduce variant that cannot sum every chunk in place.

    Example:
        >>> fused_kernel_asked_for(FusedConfig(copy_engine=False)), fused_kernel_asked_for(FusedConfig())
        (True, False)
    """
    if config.comm_programs or config.reduce_at_owner is not None or config.copy_engine is not None:
        return True
    return config.all_reduce_variant not in ANY_CHUNK_IN_PLACE


def problem(output, A, B) -> tuple:
    """(key, spec): the workspace of one problem, this rank's partial product (M, N) on the heap."""
    M, N = A.shape[0], B.shape[1]
    key = ("matmul_all_reduce", M, N, output.dtype, "pipelined")
    return key, {"partials": _fused.Buffer(M * N, output.dtype, heap=True)}


def chunk_rows(M: int, chunks: int) -> list[tuple[int, int]]:
    """The (first, end) rows of each of at most ``chunks`` chunks of ``M`` rows, as even as whole rows allow.

    Example:
        >>> chunk_rows(72, 5)
        [(0, 15), (15, 30), (30, 45), (45, 60), (60, 72)]
    """
    if M <= 0:
        return []
    size = -(-M // min(chunks, M))
    return [(first, min(first + size, M)) for first in range(0, M, size)]


def gemm_programs(sm_share: int, comm_sms: int | None, k: int) -> int:
    """The programs of a chunk's GEMM, inner dimension ``k``, on a GPU whose rank has ``sm_share`` SMs,
    ``comm_sms`` of them left to the chunks' sums (None: :data:`COMM_SMS`, or :data:`DEEP_K_COMM_SMS` from
    :data:`DEEP_K`); at least one.

    Example:
        >>> gemm_programs(132, None, 2048), gemm_programs(132, None, 3584), gemm_programs(132, 48, 2048)
        (116, 124, 84)
    """
    if comm_sms is None:
        comm_sms = DEEP_K_COMM_SMS if k >= DEEP_K else COMM_SMS
    return max(1, sm_share - comm_sms)


def refusal(config: FusedConfig) -> str | None:
    """Why ``config`` cannot run matmul_all_reduce by the vendor's GEMM (only the pipeline has it), or None."""
    if config.vendor_gemm and (config.pipeline_chunks == 0 or fused_kernel_asked_for(config)):
        return ("FusedConfig(vendor_gemm=True) runs matmul_all_reduce as the pipeline of row chunks, but the fused "
                "kernel is asked for (pipeline_chunks=0, comm_programs, reduce_at_owner, copy_engine, or an "
                "all_reduce_variant that cannot sum a chunk in place); pass one or the other")
    return None


def run(ctx, output, A, B, bias, count: int, workspace, variant: str | None = None, vendor_gemm: bool = False,
        comm_sms: int | None = None) -> tuple:
    """One call by ``count`` chunks (the operands already checked): the workspace and the launches, bound, not
    yet launched. ``variant``: the chunks' all_reduce variant (``FusedConfig.all_reduce_variant``; None:
    iris.ccl's choice by size); one that cannot sum a chunk in place raises ValueError before any launch.
    ``vendor_gemm``: torch's GEMM (cuBLAS, hipBLASLt) computes each chunk, on every SM, instead of Iris's
    (output must have A's dtype). ``comm_sms``: the SMs Iris's GEMM leaves to the sums (:func:`gemm_programs`)."""
    M, N = A.shape[0], B.shape[1]
    key, spec = problem(output, A, B)
    workspace = _fused.workspace_for(ctx, "matmul_all_reduce", key, spec, workspace)
    partials = workspace.partials.view(M, N)
    sums = Config(all_reduce_variant=variant)
    rows = chunk_rows(M, count)
    for first, end in rows:  # each chunk's sum checked now (in place, a landing zone's size), not mid-call
        ctx.ccl.all_reduce_preamble(partials[first:end], partials[first:end], config=sums)
    backend = ctx.team.backend
    programs = gemm_programs(_fused.sm_share(ctx), comm_sms, A.shape[1]) if backend.compiles_kernels else None
    bias_here = bias if ctx.team.participants(None).index == 0 else None  # added once, by member 0

    device = A.device

    def computed(first: int, end: int):  # the caller's tensors held weakly: a plan keeps none alive
        def launch(A, B, bias):
            if not vendor_gemm:
                matmul(A[first:end], B, out=partials[first:end], bias=bias, programs=programs)
            elif bias is None:
                torch.mm(A[first:end], B, out=partials[first:end])
            else:
                torch.addmm(bias.to(partials.dtype), A[first:end], B, out=partials[first:end])
        return weakly_held(launch, A, B, bias_here)

    def summed(first: int, end: int):
        def launch(output):
            side = _fused.side_stream(device) if backend.has_streams else None
            if side is not None:  # behind the chunk's GEMM, beside the next chunks'
                side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # None: the one stream, in order
                ctx.ccl.all_reduce(partials[first:end], partials[first:end], config=sums)
                output[first:end].copy_(partials[first:end])
        return weakly_held(launch, output)

    def joined():
        if backend.has_streams:
            torch.cuda.current_stream().wait_stream(_fused.side_stream(device))

    launches = [ctx.team.barrier.launch(None)]
    for first, end in rows:
        launches += [computed(first, end), summed(first, end)]
    return workspace, launches + [joined]
