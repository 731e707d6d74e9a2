"""``iris.ops.matmul_reduce_scatter(ctx, ...)``: the op as a function of the context.

The kernel is in :mod:`iris.ops.matmul_all_reduce.kernel`.

Example:
    >>> from iris.ops.matmul_reduce_scatter import matmul_reduce_scatter
    >>> matmul_reduce_scatter(ctx, out, a_shard, b_shard)   # ctx.ops.matmul_reduce_scatter(...), the same
"""

from iris.ops._fused import standalone

matmul_reduce_scatter, matmul_reduce_scatter_preamble = standalone("matmul_reduce_scatter")
