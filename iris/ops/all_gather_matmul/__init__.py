"""``iris.ops.all_gather_matmul(ctx, ...)``: the op as a function of the context.

One folder, the op and its paths: :mod:`~iris.ops.all_gather_matmul.kernel` (the fused kernel) and
:mod:`~iris.ops.all_gather_matmul.vendor_gemm` (the gathered shards multiplied by the vendor's GEMM).

Example:
    >>> from iris.ops.all_gather_matmul import all_gather_matmul
    >>> all_gather_matmul(ctx, out, a_shard, b)   # ctx.ops.all_gather_matmul(...), the same
"""

from iris.ops._fused import standalone

all_gather_matmul, all_gather_matmul_preamble = standalone("all_gather_matmul", "A_shard")
