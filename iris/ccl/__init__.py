"""Collectives written in Triton over the symmetric heap: ``ctx.ccl.all_reduce(...)`` and friends.

Every collective is launched on the current stream, checks its arguments before any launch,
starts with a device barrier of its group (every member's buffers are ready) and, unless
``async_op=True``, ends with one (every member's result is complete in stream order).
Nothing falls back to NCCL or torch.distributed: a tensor another rank must reach has to be
on the symmetric heap (``ctx.empty``/``ctx.zeros``, or ``ctx.as_symmetric(t)`` to copy it in).

Example:
    >>> ctx = iris.iris(1 << 30)
    >>> x = ctx.randn(4096, dtype=torch.bfloat16)
    >>> ctx.ccl.all_reduce(x, x)                               # in place, SUM
    >>> out = ctx.empty(ctx.get_num_ranks() * 4096, dtype=torch.bfloat16)
    >>> ctx.ccl.all_gather(out, x)
"""

from iris.ccl.config import Config, ReduceOp

__all__ = ["CCL", "Config", "ReduceOp"]


class CCL:
    """The collectives of one Iris context (``ctx.ccl``); see :mod:`iris.ccl`."""

    def __init__(self, ctx):
        self._ctx = ctx

    def all_gather(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """(W*M, N) output from each member's (M, N) input; see :func:`iris.ccl.all_gather.all_gather`."""
        from iris.ccl.all_gather import all_gather

        all_gather(output_tensor, input_tensor, self._ctx, group=group, async_op=async_op, config=config)

    def all_to_all(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """(M, W*N) chunks exchanged between members; see :func:`iris.ccl.all_to_all.all_to_all`."""
        from iris.ccl.all_to_all import all_to_all

        all_to_all(output_tensor, input_tensor, self._ctx, group=group, async_op=async_op, config=config)

    def broadcast(self, tensor, src=0, group=None, async_op=False, config=None):
        """Rank ``src``'s tensor into every member's; see :func:`iris.ccl.broadcast.broadcast`."""
        from iris.ccl.broadcast import broadcast

        broadcast(tensor, self._ctx, src=src, group=group, async_op=async_op, config=config)

    def reduce_scatter(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None):
        """Each member's part of the reduction over members; see :mod:`iris.ccl.reduce_scatter`."""
        from iris.ccl.reduce_scatter import reduce_scatter

        reduce_scatter(output_tensor, input_tensor, self._ctx, op=ReduceOp.SUM if op is None else op, group=group,
                       async_op=async_op, config=config)

    def all_reduce_preamble(self, output_tensor, input_tensor, config=None, workspace=None, group=None):
        """Checks and variant choice done once, for repeated all_reduce calls; see :mod:`iris.ccl.all_reduce`."""
        from iris.ccl.all_reduce import all_reduce_preamble

        return all_reduce_preamble(output_tensor, input_tensor, self._ctx, config=config, workspace=workspace,
                                   group=group)

    def all_reduce(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None,
                   workspace=None):
        """Elementwise SUM/MAX/MIN over members, on every member; see :func:`iris.ccl.all_reduce.all_reduce`."""
        from iris.ccl.all_reduce import all_reduce

        all_reduce(output_tensor, input_tensor, self._ctx, op=ReduceOp.SUM if op is None else op, group=group,
                   async_op=async_op, config=config, workspace=workspace)
