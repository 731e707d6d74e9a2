"""GEMM, and GEMM fused with communication: ``iris.ops.matmul`` and ``ctx.ops.<op>``.

Every fused op is one persistent Triton kernel per rank that overlaps its GEMM tiles with the
transfers (see each module):

=========================  =====================================  ==================================
op                         every rank passes                      every rank gets
=========================  =====================================  ==================================
``matmul_all_reduce``      A (M, K_r), B (K_r, N)                 output (M, N) = sum_r A_r @ B_r
``matmul_reduce_scatter``  A (M, K_r), B (K_r, N)                 output (M, N/W): its columns of it
``all_gather_matmul``      A_shard (M, K_r), B (W*K_r, N)         output (M, N) = [A_0 .. A_W-1] @ B
``matmul_all_gather``      A (M, K), B (K, N)                     output (W*M, N), rows r*M.. = A_r @ B
``gemm_all_scatter``       A (M, K), B (K, N)                     output (M, W*N), cols r*N.. = A @ B_r
=========================  =====================================  ==================================

``bias`` (N,) is added once to the result (B's columns). The outputs of matmul_all_gather and
gemm_all_scatter are written by peers, so they must be on the heap (``ctx.empty``). Each op has a
``*_preamble(output, A, B, config=None)`` that makes its workspace up front (every rank at once);
without one, ``ctx.ops`` makes it on first use and keeps it per problem. The original's standalone
forms (context first) are here too, each in a package of the op's name (``iris.ops.matmul_reduce_scatter``),
which holds the op's kernels (one folder per op).

A call remembers its launches (see :mod:`iris.host.replay`): called again with the same tensors
(address, shape, strides, dtype), bias, config (by value), workspace and tracing switch, a fused op
skips its checks and Triton's per-call Python and relaunches them (on an H200 host the full path
cost 80-165 us per call, more than the GPU time of a decode-sized op). Debug mode always takes the
full path.

Example:
    >>> out = iris.ops.matmul(a, b, bias=bias)                  # one GPU: see iris.ops.gemm
    >>> ctx.ops.matmul_all_reduce(out, a_shard, b_shard)        # every rank
    >>> iris.ops.matmul_all_reduce(ctx, out, a_shard, b_shard)  # the same, the original's standalone form
"""

import weakref

from iris.host.replay import Plans, call_key, value_key
from iris.ops.all_gather_matmul import kernel as _gather_matmul
from iris.ops.matmul_all_gather import kernel as _matmul_gather
from iris.ops.matmul_all_reduce import kernel as _matmul_reduce
from iris.ops._fused import Workspace, sm_share
from iris.ops.all_gather_matmul import all_gather_matmul, all_gather_matmul_preamble
from iris.ops.config import FusedConfig
from iris.ops.gemm import matmul
from iris.ops.gemm_all_scatter import gemm_all_scatter, gemm_all_scatter_preamble
from iris.ops.matmul_all_gather import matmul_all_gather, matmul_all_gather_preamble
from iris.ops.matmul_all_reduce import matmul_all_reduce, matmul_all_reduce_preamble
from iris.ops.matmul_reduce_scatter import matmul_reduce_scatter, matmul_reduce_scatter_preamble
from iris.host.team import checked_across_ranks

__all__ = ["FusedConfig", "FusedWorkspace", "Ops", "OpsNamespace", "Workspace",
           "all_gather_matmul", "all_gather_matmul_preamble", "gemm_all_scatter",
           "gemm_all_scatter_preamble", "matmul", "matmul_all_gather", "matmul_all_gather_preamble",
           "matmul_all_reduce", "matmul_all_reduce_preamble", "matmul_reduce_scatter",
           "matmul_reduce_scatter_preamble", "sm_share"]


class Ops:
    """The fused operations of one Iris context (``ctx.ops``); see :mod:`iris.ops`."""

    def __init__(self, ctx):
        self._ctx = weakref.proxy(ctx)  # held weakly: the context, and with it the heap, dies with its last user
        self._plans = Plans(self._ctx)
        self._tracing = ctx.tracing  # read on every call (its switch is in the call's key); it holds ctx weakly

    def _call(self, op: str, run, output, A, B, bias, async_op, config, workspace):
        """``run()`` (checks; returns the workspace and the call's launches, bound, not yet launched), then
        the launches, the first time; the same call again (the same tensors, config, workspace and
        tracing switch) only relaunches them."""
        operands = call_key("", B, bias)  # None if either is neither a tensor nor (bias) None
        key, plan = (None, None) if operands is None else self._plans.replay_call(
            op, output, A, operands, async_op, value_key(config, FusedConfig), workspace, self._tracing.enabled)
        if plan is None:
            workspace, launches = run()
            for launch in launches:
                launch()
            plan = self._plans.remember(key, launches, workspace)
        return plan.result

    def kept_workspace(self, key, make):
        """The workspace this context keeps for problem ``key``, made by ``make()`` on first use (collective:
        every rank calls it for the same problems in the same order)."""
        return self._plans.kept(key, make)

    def workspace_layout(self, op: str, output, A, B, config=None) -> tuple:
        """(key, {name: Buffer}) of ``op``'s workspace for these tensors, to lay one out by hand:
        ``Workspace(key, tensors)`` with a tensor of each Buffer's size and dtype (on the heap where
        ``Buffer.heap``)."""
        config = FusedConfig() if config is None else config
        if op in ("matmul_all_reduce", "matmul_reduce_scatter"):
            return _matmul_reduce.problem(op, op == "matmul_reduce_scatter", self._ctx, output, A, B, config)
        if op == "all_gather_matmul":
            return _gather_matmul.problem(self._ctx, output, A, config)[:2]
        return _matmul_gather.problem(op, op == "matmul_all_gather", self._ctx, A, B, config)[:2]

    @checked_across_ranks
    def matmul_all_reduce(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = sum over ranks of A @ B (+ bias)``; see :mod:`iris.ops.matmul_all_reduce.kernel`.

        ``async_op`` is accepted for the original API: each rank's output is complete when its kernel
        ends, so nothing waits after it (the same for matmul_reduce_scatter)."""
        return self._call("matmul_all_reduce", lambda: _matmul_reduce.run(
            "matmul_all_reduce", False, self._ctx, output, A, B, bias, config, workspace), output, A, B, bias, async_op,
            config, workspace)

    def matmul_all_reduce_preamble(self, output, A, B, config=None) -> Workspace:
        return _matmul_reduce.preamble("matmul_all_reduce", False, self._ctx, output, A, B, config)

    @checked_across_ranks
    def matmul_reduce_scatter(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """This rank's (M, N/W) columns of the sum over ranks of A @ B (+ bias), into an (M, N/W) output or
        into those columns of an (M, N) one; see :mod:`iris.ops.matmul_all_reduce.kernel`."""
        return self._call("matmul_reduce_scatter", lambda: _matmul_reduce.run(
            "matmul_reduce_scatter", True, self._ctx, output, A, B, bias, config, workspace), output, A, B, bias,
            async_op, config, workspace)

    def matmul_reduce_scatter_preamble(self, output, A, B, config=None) -> Workspace:
        return _matmul_reduce.preamble("matmul_reduce_scatter", True, self._ctx, output, A, B, config)

    @checked_across_ranks
    def all_gather_matmul(self, output, A_shard, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = [A_shard of every rank, side by side] @ B (+ bias)``; see
        :mod:`iris.ops.all_gather_matmul.kernel`."""
        return self._call("all_gather_matmul", lambda: _gather_matmul.all_gather_matmul(
            self._ctx, output, A_shard, B, bias, async_op, config, workspace), output, A_shard, B, bias, async_op,
            config, workspace)

    def all_gather_matmul_preamble(self, output, A_shard, B, config=None) -> Workspace:
        return _gather_matmul.preamble(self._ctx, output, A_shard, B, config)

    @checked_across_ranks
    def matmul_all_gather(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """Every rank's ``A @ B (+ bias)`` stacked by rank in rows; see :mod:`iris.ops.matmul_all_gather.kernel`."""
        return self._call("matmul_all_gather", lambda: _matmul_gather.run(
            "matmul_all_gather", True, self._ctx, output, A, B, bias, async_op, config, workspace), output, A, B, bias,
            async_op, config, workspace)

    def matmul_all_gather_preamble(self, output, A, B, config=None) -> Workspace:
        return _matmul_gather.preamble("matmul_all_gather", True, self._ctx, output, A, B, config)

    @checked_across_ranks
    def gemm_all_scatter(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """Every rank's ``A @ B (+ bias)`` side by side in columns; see :mod:`iris.ops.matmul_all_gather.kernel`."""
        return self._call("gemm_all_scatter", lambda: _matmul_gather.run(
            "gemm_all_scatter", False, self._ctx, output, A, B, bias, async_op, config, workspace), output, A, B, bias,
            async_op, config, workspace)

    def gemm_all_scatter_preamble(self, output, A, B, config=None) -> Workspace:
        return _matmul_gather.preamble("gemm_all_scatter", False, self._ctx, output, A, B, config)



#: The original's newest names: its ``FusedWorkspace`` is :class:`Workspace`, its ``OpsNamespace`` (what
#: ``ctx.ops`` is) :class:`Ops`.
FusedWorkspace = Workspace
OpsNamespace = Ops
