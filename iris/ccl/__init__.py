"""Collectives written in Triton over the symmetric heap: ``ctx.ccl.all_reduce(...)`` and friends.

The collectives: all_reduce, all_gather, reduce_scatter, all_to_all, all_to_all_v, broadcast, reduce,
gather, scatter, barrier and all_reduce_rmsnorm; point to point send, recv and sendrecv; MoE dispatch and
combine (``moe_dispatcher``). Every collective is launched on the current stream, checks its arguments before
any launch, starts with a device barrier of its group and, unless ``async_op=True``, ends with one; send and
recv meet by rendezvous between their two ranks instead (:mod:`iris.ccl.p2p`). Nothing falls back to NCCL: a
tensor another rank must reach is on the symmetric heap (``ctx.empty``); for one that is not, copy it into a heap
buffer made once (``stage = ctx.empty_like(t)``; ``stage.copy_(t)``) before each collective.

A call remembers its launches (:meth:`iris.host.replay.Plans.call`): called again with the same tensors (address,
shape, strides, dtype) and arguments, a collective skips its checks and Triton's per-call Python and relaunches
them. Debug mode always takes the full path.

Example:
    >>> ctx = iris.iris(1 << 30)
    >>> x = ctx.randn(4096, dtype=torch.bfloat16)
    >>> ctx.ccl.all_reduce(x, x)                               # in place, SUM
    >>> out = ctx.empty(ctx.get_num_ranks() * 4096, dtype=torch.bfloat16)
    >>> ctx.ccl.all_gather(out, x)
"""

import weakref

import torch

from iris.ccl.config import CollectiveConfig, Config, ReduceOp
from iris.ccl.moe import DispatchHandle, LocalExperts, MoEDispatchConfig, MoEDispatcher
from iris.host.replay import Plans, rank_specific, unchecked
from iris.host.team import check_call, check_first_call

# imported once here, not in every call (an import statement is host time on every call's path)
from iris.ccl import all_gather as _all_gather
from iris.ccl import all_reduce as _all_reduce
from iris.ccl import all_to_all as _all_to_all
from iris.ccl import all_to_all_v as _all_to_all_v
from iris.ccl import barrier as _barrier
from iris.ccl import broadcast as _broadcast
from iris.ccl import fused_ar_rmsnorm as _fused_ar_rmsnorm
from iris.ccl import p2p as _p2p
from iris.ccl import reduce_scatter as _reduce_scatter
from iris.ccl import rooted as _rooted

__all__ = ["AUTOTUNE", "CCL", "Config", "DispatchHandle", "LocalExperts", "MoEDispatchConfig", "MoEDispatcher",
           "ReduceOp"]


def _address(value):
    """A device tensor argument read by the kernels, by address (a list or other value: unhashable, never replayed)."""
    if type(value) is torch.Tensor:
        return value.data_ptr(), value.shape, value.dtype, str(value.device)
    return None if value is None else {"never replayed": value}


class CCL:
    """The collectives of one Iris context (``ctx.ccl``); see :mod:`iris.ccl`. Each call goes through
    :meth:`iris.host.replay.Plans.call` with its key and its first run (a ``_first_*`` function below)."""

    def __init__(self, ctx):
        self._ctx = weakref.proxy(ctx)  # held weakly: the context, and with it the heap, dies with its last user
        self._plans = Plans(self._ctx, check=check_first_call, config_type=CollectiveConfig)
        self._tracing = ctx.tracing  # read on every call (its switch is in the call's key); it holds ctx weakly

    def kept_workspace(self, key, make):
        """The heap workspace this context keeps for a collective's problem ``key``, made by ``make()`` on first
        use (collective: every rank asks for the same problems in the same order)."""
        return self._plans.kept(key, make)

    def all_gather(self, output_tensor, input_tensor, group=None, async_op=False, config=None, workspace=None):
        """(W*M, N) output from each member's (M, N) input; see :func:`iris.ccl.all_gather.all_gather`."""
        return self._plans.call("all_gather", output_tensor, input_tensor, config,
                                (group, async_op, workspace, self._tracing.enabled),
                                _first_all_gather, output_tensor, input_tensor, group, async_op, config, workspace)

    def all_gather_preamble(self, output_tensor, input_tensor, config=None, workspace=None, group=None):
        """The workspace of repeated all_gather calls (the ring's flags); see
        :func:`iris.ccl.all_gather.all_gather_preamble`."""
        return _all_gather.all_gather_preamble(output_tensor, input_tensor, self._ctx, config=config,
                                               workspace=workspace, group=group)

    def all_to_all(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """(M, W*N) chunks exchanged between members; see :func:`iris.ccl.all_to_all.all_to_all`."""
        return self._plans.call("all_to_all", output_tensor, input_tensor, config,
                                (group, async_op, self._tracing.enabled),
                                _first_all_to_all, output_tensor, input_tensor, group, async_op, config)

    def all_to_all_v(self, output_tensor, input_tensor, send_counts, send_displs=None, recv_counts=None,
                     recv_displs=None, group=None, async_op=False, config=None):
        """Rows of ``input_tensor`` to each member by ``send_counts`` (device tensors or lists); see
        :func:`iris.ccl.all_to_all_v.all_to_all_v`."""
        return self._plans.call("all_to_all_v", output_tensor, input_tensor, config,
                                (_address(send_counts), _address(send_displs), _address(recv_counts),
                                 _address(recv_displs), group, async_op, self._tracing.enabled),
                                _first_all_to_all_v, output_tensor, input_tensor, send_counts, send_displs,
                                recv_counts, recv_displs, group, async_op, config)

    def broadcast(self, tensor, src=0, group=None, async_op=False, config=None):
        """Rank ``src``'s tensor into every member's; see :func:`iris.ccl.broadcast.broadcast`."""
        return self._plans.call("broadcast", tensor, None, config, (src, group, async_op, self._tracing.enabled),
                                _first_broadcast, tensor, src, group, async_op, config)

    def reduce_scatter(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None,
                       workspace=None):
        """Each member's part of the reduction over members; see :mod:`iris.ccl.reduce_scatter`."""
        return self._plans.call("reduce_scatter", output_tensor, input_tensor, config,
                                (op, group, async_op, workspace, self._tracing.enabled),
                                _first_reduce_scatter, output_tensor, input_tensor, op, group, async_op, config,
                                workspace)

    def reduce(self, output_tensor, input_tensor=None, dst=0, op=None, group=None, async_op=False, config=None):
        """Rank ``dst``'s ``output_tensor`` = ``input_tensor`` (None: ``output_tensor``, in place) reduced over
        members; see :func:`iris.ccl.rooted.reduce`."""
        input_tensor = output_tensor if input_tensor is None else input_tensor
        return self._plans.call("reduce", output_tensor, input_tensor, config,
                                (dst, op, group, async_op, self._tracing.enabled),
                                _first_reduce, output_tensor, input_tensor, dst, op, group, async_op, config)

    def gather(self, output_tensor, input_tensor, dst=0, group=None, async_op=False, config=None):
        """Each member's (M, N) input into rank ``dst``'s (W*M, N) output; see :func:`iris.ccl.rooted.gather`."""
        return self._plans.call("gather", output_tensor, input_tensor, config,
                                (dst, group, async_op, self._tracing.enabled),
                                _first_gather, output_tensor, input_tensor, dst, group, async_op, config)

    def scatter(self, output_tensor, input_tensor, src=0, group=None, async_op=False, config=None):
        """Block i of rank ``src``'s (W*M, N) input into member i's (M, N) output; see
        :func:`iris.ccl.rooted.scatter`."""
        return self._plans.call("scatter", output_tensor, input_tensor, config,
                                (src, group, async_op, self._tracing.enabled),
                                _first_scatter, output_tensor, input_tensor, src, group, async_op, config)

    def send(self, tensor, dst, group=None, tag=0, config=None):
        """Store ``tensor`` into the tensor rank ``dst`` receives into; see :func:`iris.ccl.p2p.send`."""
        return self._plans.call("send", tensor, None, config, (dst, group, tag),
                                _first_send, tensor, dst, group, tag, config)

    def recv(self, tensor, src, group=None, tag=0, config=None):
        """Receive rank ``src``'s next send into ``tensor`` (on the heap); see :func:`iris.ccl.p2p.recv`."""
        return self._plans.call("recv", tensor, None, config, (src, group, tag),
                                _first_recv, tensor, src, group, tag, config)

    def sendrecv(self, send_tensor, recv_tensor, dst, src, group=None, tag=0, config=None):
        """Send to ``dst`` and receive from ``src`` at once (the receive posted first); see
        :func:`iris.ccl.p2p.sendrecv`."""
        return self._plans.call("sendrecv", send_tensor, recv_tensor, config, (dst, src, group, tag),
                                _first_sendrecv, send_tensor, recv_tensor, dst, src, group, tag, config)

    def moe_dispatcher(self, hidden_dim, num_experts, topk, max_tokens, group=None, config=None, expt_assignment=None,
                       dtype=torch.bfloat16, dispatch_dtype=None):
        """A :class:`MoEDispatcher` for this context (collective: it allocates its heap buffers); see
        :mod:`iris.ccl.moe`."""
        return MoEDispatcher(self._ctx, hidden_dim, num_experts, topk, max_tokens, group=group, config=config,
                             expt_assignment=expt_assignment, dtype=dtype, dispatch_dtype=dispatch_dtype)

    def barrier(self, group=None, async_op=False, config=None):
        """Every member of ``group`` waits for every other, on the device; see :func:`iris.ccl.barrier.barrier`."""
        if self._ctx.team.debug:  # every member made this call (a barrier is never remembered)
            check_call(self._ctx.team, "barrier", {"group": group, "async_op": async_op, "config": config})
        _barrier.barrier(self._ctx, group=group, async_op=async_op, config=config)

    def all_reduce_rmsnorm(self, partial, residual, weight, eps=1e-6, group=None, async_op=False, config=None,
                           out=None, out_scale=None):
        """``residual += `` the sum over members of ``partial``; returns ``rmsnorm(residual) * weight``, in one
        kernel (into an fp8 ``out`` with per-token ``out_scale``); see :mod:`iris.ccl.fused_ar_rmsnorm`. Given
        ``out``, repeated calls relaunch their kernel (without it each call makes a new output: never remembered)."""
        rest = () if out is None else (
            residual.data_ptr(), None if out_scale is None else out_scale.data_ptr(), residual.shape, residual.dtype,
            weight.data_ptr(), weight.shape, weight.dtype, float(eps), group, async_op, self._tracing.enabled)
        made = self._plans.call("all_reduce_rmsnorm", out, partial, None, rest, _first_all_reduce_rmsnorm, partial,
                                residual, weight, eps, group, async_op, config, out, out_scale)
        return out if made is None else made

    def all_reduce_preamble(self, output_tensor, input_tensor, config=None, workspace=None, group=None):
        """Checks and variant choice done once, for repeated all_reduce calls; see :mod:`iris.ccl.all_reduce`."""
        return _all_reduce.all_reduce_preamble(output_tensor, input_tensor, self._ctx, config=config,
                                               workspace=workspace, group=group)

    def all_reduce(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None,
                   workspace=None):
        """Elementwise SUM/MAX/MIN over members, on every member; see :func:`iris.ccl.all_reduce.all_reduce`."""
        return self._plans.call("all_reduce", output_tensor, input_tensor, config,
                                (op, group, async_op, workspace, self._tracing.enabled),
                                _first_all_reduce, output_tensor, input_tensor, op, group, async_op, config, workspace)


# Each remembered call's first run (Plans.call): ``(launches, result)``; its parameters after ``ctx`` are the
# method's, the names debug mode compares across ranks.

def _first_all_gather(ctx, output_tensor, input_tensor, group, async_op, config, workspace):
    return _all_gather.all_gather(output_tensor, input_tensor, ctx, group=group, async_op=async_op, config=config,
                                  workspace=workspace), None


def _first_all_to_all(ctx, output_tensor, input_tensor, group, async_op, config):
    return _all_to_all.all_to_all(output_tensor, input_tensor, ctx, group=group, async_op=async_op,
                                  config=config), None


@rank_specific("output_tensor", "input_tensor", "send_counts", "send_displs", "recv_counts", "recv_displs")
def _first_all_to_all_v(ctx, output_tensor, input_tensor, send_counts, send_displs, recv_counts, recv_displs, group,
                        async_op, config):
    return _all_to_all_v.all_to_all_v(output_tensor, input_tensor, ctx, send_counts, send_displs, recv_counts,
                                      recv_displs, group=group, async_op=async_op, config=config), None


def _first_broadcast(ctx, tensor, src, group, async_op, config):
    return _broadcast.broadcast(tensor, ctx, src=src, group=group, async_op=async_op, config=config), None


def _first_reduce_scatter(ctx, output_tensor, input_tensor, op, group, async_op, config, workspace):
    return _reduce_scatter.reduce_scatter(output_tensor, input_tensor, ctx, op=ReduceOp.SUM if op is None else op,
                                          group=group, async_op=async_op, config=config, workspace=workspace), None


@rank_specific("output_tensor")  # read on rank dst only
def _first_reduce(ctx, output_tensor, input_tensor, dst, op, group, async_op, config):
    return _rooted.reduce(output_tensor, input_tensor, ctx, dst=dst, op=ReduceOp.SUM if op is None else op,
                          group=group, async_op=async_op, config=config), None


def _first_gather(ctx, output_tensor, input_tensor, dst, group, async_op, config):
    return _rooted.gather(output_tensor, input_tensor, ctx, dst=dst, group=group, async_op=async_op,
                          config=config), None


def _first_scatter(ctx, output_tensor, input_tensor, src, group, async_op, config):
    return _rooted.scatter(output_tensor, input_tensor, ctx, src=src, group=group, async_op=async_op,
                           config=config), None


@unchecked  # send and recv: two ranks that pass different arguments by design
def _first_send(ctx, tensor, dst, group, tag, config):
    return _p2p.send(tensor, ctx, dst, group=group, tag=tag, config=config), None


@unchecked
def _first_recv(ctx, tensor, src, group, tag, config):
    return _p2p.recv(tensor, ctx, src, group=group, tag=tag, config=config), None


@unchecked
def _first_sendrecv(ctx, send_tensor, recv_tensor, dst, src, group, tag, config):
    return _p2p.sendrecv(send_tensor, recv_tensor, ctx, dst, src, group=group, tag=tag, config=config), None


def _first_all_reduce_rmsnorm(ctx, partial, residual, weight, eps, group, async_op, config, out, out_scale):
    """The result: the output it made, where the caller gave none (a given ``out`` is not kept by the plan)."""
    made = torch.empty_like(partial) if out is None else None
    return _fused_ar_rmsnorm.launch(ctx, partial, residual, weight, eps, group, async_op,
                                    out if made is None else made, out_scale), made


def _first_all_reduce(ctx, output_tensor, input_tensor, op, group, async_op, config, workspace):
    return _all_reduce.all_reduce(output_tensor, input_tensor, ctx, op=ReduceOp.SUM if op is None else op,
                                  group=group, async_op=async_op, config=config, workspace=workspace), None
