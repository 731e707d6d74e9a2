"""``iris.ops.matmul_all_gather``: the op with the context first, at the original's module path.

The kernel is in :mod:`iris.ops.matmul_gather`;
``ctx.ops.matmul_all_gather`` is the same call (see :mod:`iris.ops`).

Example:
    >>> from iris.ops.matmul_all_gather import matmul_all_gather
    >>> matmul_all_gather(ctx, out, a, b)
"""

from iris.ops._fused import Workspace


def matmul_all_gather(ctx, output, A, B, bias=None, async_op=False, config=None, workspace=None) -> Workspace:
    """``ctx.ops.matmul_all_gather(...)`` with the context first (the original's standalone form).

    Returns:
        The op's workspace, as the original's does.
    """
    return ctx.ops.matmul_all_gather(output, A, B, bias, async_op, config, workspace)


def matmul_all_gather_preamble(ctx, output, A, B, config=None) -> Workspace:
    """``ctx.ops.matmul_all_gather_preamble(...)`` with the context first."""
    return ctx.ops.matmul_all_gather_preamble(output, A, B, config)
