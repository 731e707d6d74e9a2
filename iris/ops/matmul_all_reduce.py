"""``iris.ops.matmul_all_reduce``: the op with the context first, at the original's module path.

The kernel is in :mod:`iris.ops.matmul_reduce`;
``ctx.ops.matmul_all_reduce`` is the same call (see :mod:`iris.ops`).

Example:
    >>> from iris.ops.matmul_all_reduce import matmul_all_reduce
    >>> matmul_all_reduce(ctx, out, a_shard, b_shard)
"""

from iris.ops._fused import Workspace


def matmul_all_reduce(ctx, output, A, B, bias=None, async_op=False, config=None, workspace=None) -> Workspace:
    """``ctx.ops.matmul_all_reduce(...)`` with the context first (the original's standalone form).

    Returns:
        The op's workspace, as the original's does.
    """
    return ctx.ops.matmul_all_reduce(output, A, B, bias, async_op, config, workspace)


def matmul_all_reduce_preamble(ctx, output, A, B, config=None) -> Workspace:
    """``ctx.ops.matmul_all_reduce_preamble(...)`` with the context first."""
    return ctx.ops.matmul_all_reduce_preamble(output, A, B, config)
