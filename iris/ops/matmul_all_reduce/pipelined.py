"""``matmul_all_reduce`` as a pipeline of row chunks: ``FusedConfig(pipeline_chunks=C)``.

Each chunk of this rank's partial product is computed into the heap (leaving some SMs free), then summed in
place by ``iris.ccl.all_reduce`` on a side stream while the next chunks compute. Why: the fused kernel takes
about GEMM + all_reduce; here they overlap. It wins for large jobs only, which ``pipeline_chunks=None`` takes.

Example:
    >>> ctx.ops.matmul_all_reduce(out, A_shard, B_shard, config=FusedConfig(pipeline_chunks=4))
"""

from __future__ import annotations

import torch

from iris.ccl.all_reduce import BARRIER_FREE, IN_PLACE
from iris.ccl.config import CollectiveConfig
from iris.host.replay import weakly_held
from iris.ops import _fused
from iris.ops.config import FusedConfig
from iris.ops.gemm import matmul

# SMs the GEMM leaves to the chunks' sums (pipeline_comm_sms None); fewer where K is deep (the GEMM dominates).
COMM_SMS = 16
DEEP_K = 3072
DEEP_K_COMM_SMS = 8
# pipeline_chunks None: BY_DEFAULT_CHUNKS chunks from this many ranks and output rows, where the pipeline wins.
BY_DEFAULT_RANKS = 4
BY_DEFAULT_ROWS = 4096
BY_DEFAULT_CHUNKS = 4
# all_reduce variants that sum a chunk of any size in place (landing-zone ones are bounded).
ANY_CHUNK_IN_PLACE = (None, *(variant for variant in IN_PLACE if variant not in BARRIER_FREE))


def default_chunks(world: int, rows: int) -> int:
    """The chunks ``pipeline_chunks=None`` takes for ``world`` ranks and ``rows`` output rows; 0: the fused kernel.

    Example:
        >>> default_chunks(4, 4096), default_chunks(2, 16384), default_chunks(4, 1024)
        (4, 0, 0)
    """
    return BY_DEFAULT_CHUNKS if world >= BY_DEFAULT_RANKS and rows >= BY_DEFAULT_ROWS else 0


def chunks(ctx, config: FusedConfig, A) -> int:
    """How many row chunks this matmul_all_reduce call pipelines by; 0: the fused kernel.

    None picks the fused kernel where nothing overlaps (no streams, shared GPUs, several nodes) or it is asked for.
    """
    if config.pipeline_chunks is not None:
        return config.pipeline_chunks
    if config.vendor_gemm:  # the vendor's GEMM runs only in the pipeline
        return BY_DEFAULT_CHUNKS
    if fused_kernel_asked_for(config) or not ctx.team.backend.has_streams or _fused.copy_refusal(ctx) is not None:
        return 0
    return default_chunks(ctx.get_num_ranks(), A.shape[0])


def fused_kernel_asked_for(config: FusedConfig) -> bool:
    """Whether ``config`` asks for the fused kernel: one of its modes, or a variant unable to sum chunks in place.

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
    """The (first, end) rows of at most ``chunks`` near-even chunks of ``M`` rows.

    Example:
        >>> chunk_rows(72, 5)
        [(0, 15), (15, 30), (30, 45), (45, 60), (60, 72)]
    """
    if M <= 0:
        return []
    size = -(-M // min(chunks, M))
    return [(first, min(first + size, M)) for first in range(0, M, size)]


def gemm_programs(sm_share: int, comm_sms: int | None, k: int) -> int:
    """A chunk GEMM's programs: ``sm_share`` SMs less ``comm_sms`` (None: by ``k``), at least one.

    Example:
        >>> gemm_programs(132, None, 2048), gemm_programs(132, None, 3584), gemm_programs(132, 48, 2048)
        (116, 124, 84)
    """
    if comm_sms is None:
        comm_sms = DEEP_K_COMM_SMS if k >= DEEP_K else COMM_SMS
    return max(1, sm_share - comm_sms)


def refusal(config: FusedConfig) -> str | None:
    """Why ``config`` cannot run the vendor's GEMM (only the pipeline has it), or None."""
    if config.vendor_gemm and (config.pipeline_chunks == 0 or fused_kernel_asked_for(config)):
        return ("FusedConfig(vendor_gemm=True) runs matmul_all_reduce as the pipeline of row chunks, but the fused "
                "kernel is asked for (pipeline_chunks=0, comm_programs, reduce_at_owner, copy_engine, or an "
                "all_reduce_variant that cannot sum a chunk in place); pass one or the other")
    return None


def run(ctx, output, A, B, bias, count: int, workspace, variant: str | None = None, vendor_gemm: bool = False,
        comm_sms: int | None = None) -> tuple:
    """One call by ``count`` chunks: the workspace and the bound launches, not yet launched.

    ``variant`` is the chunks' all_reduce variant (one unable to sum in place raises ValueError first);
    ``vendor_gemm`` computes chunks with torch's GEMM; ``comm_sms`` as in :func:`gemm_programs`."""
    M, N = A.shape[0], B.shape[1]
    key, spec = problem(output, A, B)
    workspace = _fused.workspace_for(ctx, "matmul_all_reduce", key, spec, workspace)
    partials = workspace.partials.view(M, N)
    sums = CollectiveConfig(all_reduce_variant=variant)
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
