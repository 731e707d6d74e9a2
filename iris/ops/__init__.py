"""GEMM, and GEMM fused with communication: ``iris.ops.matmul`` and ``ctx.ops.matmul_all_reduce``.

Example:
    >>> out = iris.ops.matmul(a, b, bias=bias)                  # one GPU: see iris.ops.gemm
    >>> ctx.ops.matmul_all_reduce(out, a_shard, b_shard)        # every rank: see iris.ops.matmul_all_reduce
"""

from iris.ops.config import FusedConfig
from iris.ops.gemm import matmul

__all__ = ["FusedConfig", "Ops", "matmul"]


class Ops:
    """The fused operations of one Iris context (``ctx.ops``)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self._workspaces: dict = {}

    def _workspace(self, shape, config, make):
        """The workspace kept for this output shape and config (made on first use: every rank at once)."""
        key = (tuple(shape), tuple(vars(config).values()))
        if key not in self._workspaces:
            self._workspaces[key] = make()
        return self._workspaces[key]

    def matmul_all_reduce_preamble(self, output, A, B, config=None):
        """The workspace for repeated calls; see :func:`iris.ops.matmul_all_reduce.matmul_all_reduce_preamble`."""
        from iris.ops.matmul_all_reduce import matmul_all_reduce_preamble

        return matmul_all_reduce_preamble(output, A, B, self._ctx, config=config)

    def matmul_all_reduce(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = sum over ranks of A @ B (+ bias)``; see :mod:`iris.ops.matmul_all_reduce`."""
        from iris.ops.matmul_all_reduce import matmul_all_reduce

        matmul_all_reduce(output, A, B, self._ctx, bias=bias, async_op=async_op, config=config, workspace=workspace)
