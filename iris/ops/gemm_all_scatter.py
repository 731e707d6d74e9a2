"""``iris.ops.gemm_all_scatter``: the op with the context first, at the original's module path.

The kernel is in :mod:`iris.ops.matmul_gather`;
``ctx.ops.gemm_all_scatter`` is the same call (see :mod:`iris.ops`).

Example:
    >>> from iris.ops.gemm_all_scatter import gemm_all_scatter
    >>> gemm_all_scatter(ctx, out, a, b_shard)
"""

from iris.ops._fused import Workspace


def gemm_all_scatter(ctx, output, A, B, bias=None, async_op=False, config=None, workspace=None) -> Workspace:
    """``ctx.ops.gemm_all_scatter(...)`` with the context first (the original's standalone form).

    Returns:
        The op's workspace, as the original's does.
    """
    return ctx.ops.gemm_all_scatter(output, A, B, bias, async_op, config, workspace)


def gemm_all_scatter_preamble(ctx, output, A, B, config=None) -> Workspace:
    """``ctx.ops.gemm_all_scatter_preamble(...)`` with the context first."""
    return ctx.ops.gemm_all_scatter_preamble(output, A, B, config)
