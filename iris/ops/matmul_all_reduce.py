"""``iris.ops.matmul_all_reduce(ctx, ...)``, at the original's module path.

The kernel is in :mod:`iris.ops.matmul_reduce`.

Example:
    >>> from iris.ops.matmul_all_reduce import matmul_all_reduce
    >>> matmul_all_reduce(ctx, out, a_shard, b_shard)   # ctx.ops.matmul_all_reduce(...), the same
"""

from iris.ops._fused import standalone

matmul_all_reduce, matmul_all_reduce_preamble = standalone("matmul_all_reduce")
