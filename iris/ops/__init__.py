"""GEMM and, on top of it, GEMM fused with communication (the fused operations are to come).

Example:
    >>> out = iris.ops.matmul(a, b, bias=bias)   # see iris.ops.gemm
"""

from iris.ops.gemm import matmul

__all__ = ["matmul"]
