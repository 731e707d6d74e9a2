"""GEMM, and GEMM fused with communication: ``iris.ops.matmul`` and ``ctx.ops.<op>``, each one persistent Triton
kernel per rank that overlaps its GEMM tiles with the transfers (each op's package holds its kernels):

- ``matmul_all_reduce(output, A (M, K_r), B (K_r, N))``: output (M, N) = sum_r A_r @ B_r;
- ``matmul_reduce_scatter``: the same inputs; output (M, N/W), this rank's columns of it;
- ``all_gather_matmul(output, A_shard (M, K_r), B (W*K_r, N))``: output (M, N) = [A_0 .. A_W-1] @ B;
- ``matmul_all_gather(output, A (M, K), B (K, N))``: output (W*M, N) on the heap, rows r*M.. = A_r @ B;
- ``gemm_all_scatter``: the same inputs; output (M, W*N) on the heap, columns r*N.. = A @ B_r.

``bias`` (N,) is added once. ``*_preamble(output, A, B, config=None)`` makes an op's workspace up front (every
rank at once); without one ``ctx.ops`` makes it on first use. A repeated call relaunches its remembered launches
(:meth:`iris.host.replay.Plans.call`), except in debug mode.

Example:
    >>> ctx.ops.matmul_all_reduce(out, a_shard, b_shard)        # every rank
    >>> iris.ops.matmul_all_reduce(ctx, out, a_shard, b_shard)  # the same, standalone
"""

import weakref

from iris.host.replay import Plans, call_key
from iris.ops.all_gather_matmul import kernel as _gather_matmul
from iris.ops.matmul_all_gather import kernel as _matmul_gather
from iris.ops.matmul_all_reduce import kernel as _matmul_reduce
from iris.ops._fused import Workspace, sm_share
from iris.ops.all_gather_matmul import all_gather_matmul, all_gather_matmul_preamble
from iris.ops import config as _config
from iris.ops.config import FusedConfig
from iris.ops.gemm import matmul
from iris.ops.gemm_all_scatter import gemm_all_scatter, gemm_all_scatter_preamble
from iris.ops.matmul_all_gather import matmul_all_gather, matmul_all_gather_preamble
from iris.ops.matmul_all_reduce import matmul_all_reduce, matmul_all_reduce_preamble
from iris.ops.matmul_reduce_scatter import matmul_reduce_scatter, matmul_reduce_scatter_preamble
from iris.host.team import check_first_call

__all__ = ["FusedConfig", "FusedWorkspace", "Ops", "OpsNamespace", "Workspace",
           "all_gather_matmul", "all_gather_matmul_preamble", "gemm_all_scatter",
           "gemm_all_scatter_preamble", "matmul", "matmul_all_gather", "matmul_all_gather_preamble",
           "matmul_all_reduce", "matmul_all_reduce_preamble", "matmul_reduce_scatter",
           "matmul_reduce_scatter_preamble", "sm_share"]


class Ops:
    """The fused operations of one Iris context (``ctx.ops``); see :mod:`iris.ops`."""

    def __init__(self, ctx):
        self._ctx = weakref.proxy(ctx)  # held weakly: the context, and with it the heap, dies with its last user
        self._plans = Plans(self._ctx, check=check_first_call, config_type=_config.FusedConfig)  # the native class
        self._tracing = ctx.tracing  # read on every call (its switch is in the call's key); it holds ctx weakly

    def _call(self, op: str, run, output, A, B, bias, async_op, config, workspace):
        """A fused op's call (:meth:`iris.host.replay.Plans.call`) with ``run``, its first run."""
        operands = call_key("", B, bias)  # None where B or bias is not a plain tensor: the call is not remembered
        return self._plans.call(op, None if operands is None else output, A, config,
                                (operands, async_op, workspace, self._tracing.enabled), run, output, A, B, bias,
                                async_op, config, workspace)

    def kept_workspace(self, key, make):
        """The workspace kept for problem ``key``, made by ``make()`` on first use (collective)."""
        return self._plans.kept(key, make)

    def workspace_layout(self, op: str, output, A, B, config=None) -> tuple:
        """(key, {name: Buffer}) of ``op``'s workspace, to lay one out by hand: ``Workspace(key, tensors)`` with a
        tensor of each Buffer's size and dtype (on the heap where ``Buffer.heap``)."""
        config = _config.FusedConfig() if config is None else config
        if op in ("matmul_all_reduce", "matmul_reduce_scatter"):
            return _matmul_reduce.problem(op, op == "matmul_reduce_scatter", self._ctx, output, A, B, config)
        if op == "all_gather_matmul":
            return _gather_matmul.problem(self._ctx, output, A, config)[:2]
        return _matmul_gather.problem(op, op == "matmul_all_gather", self._ctx, A, B, config)[:2]

    def matmul_all_reduce(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = sum over ranks of A @ B (+ bias)``; see :mod:`iris.ops.matmul_all_reduce.kernel`. ``async_op``
        changes nothing (each rank's output is complete when its kernel ends), here and in matmul_reduce_scatter."""
        return self._call("matmul_all_reduce", _first_matmul_all_reduce, output, A, B, bias, async_op, config,
                          workspace)

    def matmul_all_reduce_preamble(self, output, A, B, config=None) -> Workspace:
        return _matmul_reduce.preamble("matmul_all_reduce", False, self._ctx, output, A, B, config)

    def matmul_reduce_scatter(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """This rank's (M, N/W) columns of the sum over ranks of A @ B (+ bias), into an (M, N/W) output or
        into those columns of an (M, N) one; see :mod:`iris.ops.matmul_all_reduce.kernel`."""
        return self._call("matmul_reduce_scatter", _first_matmul_reduce_scatter, output, A, B, bias, async_op, config,
                          workspace)

    def matmul_reduce_scatter_preamble(self, output, A, B, config=None) -> Workspace:
        return _matmul_reduce.preamble("matmul_reduce_scatter", True, self._ctx, output, A, B, config)

    def all_gather_matmul(self, output, A_shard, B, bias=None, async_op=False, config=None, workspace=None):
        """``output = [A_shard of every rank, side by side] @ B (+ bias)``; see iris.ops.all_gather_matmul.kernel."""
        return self._call("all_gather_matmul", _first_all_gather_matmul, output, A_shard, B, bias, async_op, config,
                          workspace)

    def all_gather_matmul_preamble(self, output, A_shard, B, config=None) -> Workspace:
        return _gather_matmul.preamble(self._ctx, output, A_shard, B, config)

    def matmul_all_gather(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """Every rank's ``A @ B (+ bias)`` stacked by rank in rows; see :mod:`iris.ops.matmul_all_gather.kernel`."""
        return self._call("matmul_all_gather", _first_matmul_all_gather, output, A, B, bias, async_op, config,
                          workspace)

    def matmul_all_gather_preamble(self, output, A, B, config=None) -> Workspace:
        return _matmul_gather.preamble("matmul_all_gather", True, self._ctx, output, A, B, config)

    def gemm_all_scatter(self, output, A, B, bias=None, async_op=False, config=None, workspace=None):
        """Every rank's ``A @ B (+ bias)`` side by side in columns; see :mod:`iris.ops.matmul_all_gather.kernel`."""
        return self._call("gemm_all_scatter", _first_gemm_all_scatter, output, A, B, bias, async_op, config,
                          workspace)

    def gemm_all_scatter_preamble(self, output, A, B, config=None) -> Workspace:
        return _matmul_gather.preamble("gemm_all_scatter", False, self._ctx, output, A, B, config)


# Each op's first run: (launches, workspace); its parameters after ctx name the method's for debug mode's check.

def _launched(workspace, launches):
    for launch in launches:
        launch()
    return launches, workspace


def _first_matmul_all_reduce(ctx, output, A, B, bias, async_op, config, workspace):
    return _launched(*_matmul_reduce.run("matmul_all_reduce", False, ctx, output, A, B, bias, config, workspace))


def _first_matmul_reduce_scatter(ctx, output, A, B, bias, async_op, config, workspace):
    return _launched(*_matmul_reduce.run("matmul_reduce_scatter", True, ctx, output, A, B, bias, config, workspace))


def _first_all_gather_matmul(ctx, output, A_shard, B, bias, async_op, config, workspace):
    return _launched(*_gather_matmul.all_gather_matmul(ctx, output, A_shard, B, bias, async_op, config, workspace))


def _first_matmul_all_gather(ctx, output, A, B, bias, async_op, config, workspace):
    return _launched(*_matmul_gather.run("matmul_all_gather", True, ctx, output, A, B, bias, async_op, config,
                                         workspace))


def _first_gemm_all_scatter(ctx, output, A, B, bias, async_op, config, workspace):
    return _launched(*_matmul_gather.run("gemm_all_scatter", False, ctx, output, A, B, bias, async_op, config,
                                         workspace))


#: Other names of the same things
FusedWorkspace = Workspace
OpsNamespace = Ops
