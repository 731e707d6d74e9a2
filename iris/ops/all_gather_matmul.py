"""``iris.ops.all_gather_matmul``: the op with the context first, at the original's module path.

The kernel is in :mod:`iris.ops.gather_matmul`;
``ctx.ops.all_gather_matmul`` is the same call (see :mod:`iris.ops`).

Example:
    >>> from iris.ops.all_gather_matmul import all_gather_matmul
    >>> all_gather_matmul(ctx, out, a_shard, b)
"""

from iris.ops._fused import Workspace


def all_gather_matmul(ctx, output, A_shard, B, bias=None, async_op=False, config=None, workspace=None) -> Workspace:
    """``ctx.ops.all_gather_matmul(...)`` with the context first (the original's standalone form).

    Returns:
        The op's workspace, as the original's does.
    """
    return ctx.ops.all_gather_matmul(output, A_shard, B, bias, async_op, config, workspace)


def all_gather_matmul_preamble(ctx, output, A_shard, B, config=None) -> Workspace:
    """``ctx.ops.all_gather_matmul_preamble(...)`` with the context first."""
    return ctx.ops.all_gather_matmul_preamble(output, A_shard, B, config)
