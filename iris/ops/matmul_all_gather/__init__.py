"""``iris.ops.matmul_all_gather(ctx, ...)``: the op as a function of the context.

The kernel is in :mod:`iris.ops.matmul_all_gather.kernel`.

Example:
    >>> from iris.ops.matmul_all_gather import matmul_all_gather
    >>> matmul_all_gather(ctx, out, a, b)   # ctx.ops.matmul_all_gather(...), the same
"""

from iris.ops._fused import standalone

matmul_all_gather, matmul_all_gather_preamble = standalone("matmul_all_gather")
