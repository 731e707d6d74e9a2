"""``iris.ops.matmul_all_reduce(ctx, ...)``: the op as a function of the context.

One folder, the op and its paths: :mod:`~iris.ops.matmul_all_reduce.kernel` (the fused kernel, also
matmul_reduce_scatter's), :mod:`~iris.ops.matmul_all_reduce.copy_engine` (the partials sent by copies) and
:mod:`~iris.ops.matmul_all_reduce.pipelined` (row chunks: a GEMM, then each chunk's all_reduce beside it).

Example:
    >>> from iris.ops.matmul_all_reduce import matmul_all_reduce
    >>> matmul_all_reduce(ctx, out, a_shard, b_shard)   # ctx.ops.matmul_all_reduce(...), the same
"""

from iris.ops._fused import standalone

matmul_all_reduce, matmul_all_reduce_preamble = standalone("matmul_all_reduce")
