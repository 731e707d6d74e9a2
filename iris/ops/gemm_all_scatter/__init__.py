"""``iris.ops.gemm_all_scatter(ctx, ...)``: the op as a function of the context.

The kernel is in :mod:`iris.ops.matmul_all_gather.kernel`.

Example:
    >>> from iris.ops.gemm_all_scatter import gemm_all_scatter
    >>> gemm_all_scatter(ctx, out, a, b_shard)   # ctx.ops.gemm_all_scatter(...), the same
"""

from iris.ops._fused import standalone

gemm_all_scatter, gemm_all_scatter_preamble = standalone("gemm_all_scatter")
