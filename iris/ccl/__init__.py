"""Collectives written in Triton over the symmetric heap: ``ctx.ccl.all_reduce(...)`` and friends.

The collectives: all_reduce, all_gather, reduce_scatter, all_to_all, all_to_all_v, broadcast, reduce,
gather, scatter, barrier and all_reduce_rmsnorm; point to point send, recv and sendrecv; MoE dispatch and
combine (``moe_dispatcher``). Every collective is launched on the current stream, checks its arguments before
any launch, starts with a device barrier of its group (every member's buffers are ready) and, unless
``async_op=True``, ends with one (every member's result is complete in stream order). send and recv meet by
rendezvous between their two ranks instead (:mod:`iris.ccl.p2p`).
Nothing falls back to NCCL or torch.distributed: a tensor another rank must reach has to be
on the symmetric heap (``ctx.empty``/``ctx.zeros``). Copy-in path for a tensor that is not:
make a heap buffer once (``stage = ctx.empty_like(t)``, or ``ctx.as_symmetric(t)``, which
allocates a new one on every call) and ``stage.copy_(t)`` before each collective; the benchmark
(benchmarks/ccl.py) times this path beside the others as ``iris.copy_in``.

A call remembers its launches (see :mod:`iris.host.replay`): called again with the same
tensors (address, shape, strides, dtype) and arguments, a collective skips its checks and
Triton's per-call Python and relaunches them, so small messages cost little more than the
GPU's time. Debug mode always takes the full path.

Example:
    >>> ctx = iris.iris(1 << 30)
    >>> x = ctx.randn(4096, dtype=torch.bfloat16)
    >>> ctx.ccl.all_reduce(x, x)                               # in place, SUM
    >>> out = ctx.empty(ctx.get_num_ranks() * 4096, dtype=torch.bfloat16)
    >>> ctx.ccl.all_gather(out, x)
"""

import weakref

import torch

from iris.ccl.config import AUTOTUNE, Config, ReduceOp
from iris.ccl.moe import DispatchHandle, LocalExperts, MoEDispatchConfig, MoEDispatcher
from iris.host.replay import Plans, value_key
from iris.host.team import check_call

# The collectives, imported once here rather than in every call (an import statement costs about
# 1-2 us per call, a fair part of a small collective's host time).
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
    return None if value is None else [value]


class CCL:
    """The collectives of one Iris context (``ctx.ccl``); see :mod:`iris.ccl`."""

    def __init__(self, ctx):
        self._ctx = weakref.proxy(ctx)  # held weakly: the context, and with it the heap, dies with its last user
        self._plans = Plans(self._ctx)
        self._tracing = ctx.tracing  # read on every call (its switch is in the call's key); it holds ctx weakly

    def _check(self, name: str, arguments: dict) -> None:
        """Debug mode: every member of the group made this call (:func:`iris.host.team.check_call`). Called where a
        call is not replayed (in debug mode no call is), with the method's ``locals()`` (its key, plan and self
        left out): a replayed call pays nothing for it."""
        check_call(self._ctx.team, name, {k: v for k, v in arguments.items() if k not in ("self", "key", "plan")})

    def kept_workspace(self, key, make):
        """The heap workspace this context keeps for a collective's problem ``key`` (the hierarchical
        reduce_scatter's), made by ``make()`` on first use (collective: every rank of the job asks for the
        same problems in the same order)."""
        return self._plans.kept(key, make)

    def all_gather(self, output_tensor, input_tensor, group=None, async_op=False, config=None, workspace=None):
        """(W*M, N) output from each member's (M, N) input; see :func:`iris.ccl.all_gather.all_gather`."""
        key, plan = self._plans.replay_call("all_gather", output_tensor, input_tensor, group, async_op,
                                            value_key(config, Config), workspace, self._tracing.enabled)
        if plan is None:
            self._check("all_gather", locals())
            self._plans.remember(key, _all_gather.all_gather(output_tensor, input_tensor, self._ctx, group=group,
                                                             async_op=async_op, config=config, workspace=workspace))

    def all_gather_preamble(self, output_tensor, input_tensor, config=None, workspace=None, group=None):
        """The workspace of repeated all_gather calls (the ring's flags); see
        :func:`iris.ccl.all_gather.all_gather_preamble`."""
        return _all_gather.all_gather_preamble(output_tensor, input_tensor, self._ctx, config=config,
                                               workspace=workspace, group=group)

    def all_to_all(self, output_tensor, input_tensor, group=None, async_op=False, config=None):
        """(M, W*N) chunks exchanged between members; see :func:`iris.ccl.all_to_all.all_to_all`."""
        key, plan = self._plans.replay_call("all_to_all", output_tensor, input_tensor, group, async_op,
                                            value_key(config, Config), self._tracing.enabled)
        if plan is None:
            self._check("all_to_all", locals())
            self._plans.remember(key, _all_to_all.all_to_all(output_tensor, input_tensor, self._ctx, group=group,
                                                             async_op=async_op, config=config))

    def all_to_all_v(self, output_tensor, input_tensor, send_counts=None, send_displs=None, recv_counts=None,
                     recv_displs=None, group=None, async_op=False, config=None, *, output_split_sizes=None,
                     input_split_sizes=None):
        """Rows of ``input_tensor`` to each member by ``send_counts`` (device tensors or lists); see
        :func:`iris.ccl.all_to_all_v.all_to_all_v`. The original's newest form, columns by split sizes
        (``all_to_all_v(output, input, output_split_sizes, input_split_sizes)``, positional or by keyword),
        is recognised and taken by :func:`iris.ccl.all_to_all_v.all_to_all_v_columns`, its ``group``, ``async_op``
        and ``config`` by keyword or, as the original's method takes them, positionally after the sizes."""
        if _all_to_all_v.original_positionals(recv_counts, recv_displs):  # its (group, async_op, config) after them
            recv_counts, recv_displs, group, async_op, config = None, None, recv_counts, \
                async_op if recv_displs is None else recv_displs, config if group is None else group
        if output_split_sizes is not None or input_split_sizes is not None or _all_to_all_v.is_column_call(
                output_tensor, input_tensor, send_counts, send_displs, recv_counts, recv_displs):
            if output_split_sizes is None and input_split_sizes is None:
                output_split_sizes, input_split_sizes = send_counts, send_displs
            elif send_counts is not None or send_displs is not None:
                raise TypeError("all_to_all_v: give either send_counts (rows) or output_split_sizes and "
                                "input_split_sizes (columns), not both")
            self._check("all_to_all_v", {"output columns": output_split_sizes, "group": group,
                                         "async_op": async_op, "config": config})
            _all_to_all_v.all_to_all_v_columns(output_tensor, input_tensor, self._ctx, output_split_sizes,
                                               input_split_sizes, group=group, async_op=async_op, config=config)
            return
        if send_counts is None:
            raise TypeError("all_to_all_v: send_counts (or output_split_sizes and input_split_sizes) is required")
        key, plan = self._plans.replay_call("all_to_all_v", output_tensor, input_tensor, _address(send_counts),
                                            _address(send_displs), _address(recv_counts), _address(recv_displs),
                                            group, async_op, value_key(config, Config), self._tracing.enabled)
        if plan is None:
            self._check("all_to_all_v", locals())
            self._plans.remember(key, _all_to_all_v.all_to_all_v(output_tensor, input_tensor, self._ctx, send_counts,
                                                                 send_displs, recv_counts, recv_displs, group=group,
                                                                 async_op=async_op, config=config))

    def broadcast(self, tensor, src=0, group=None, async_op=False, config=None):
        """Rank ``src``'s tensor into every member's; see :func:`iris.ccl.broadcast.broadcast`."""
        key, plan = self._plans.replay_call("broadcast", tensor, None, src, group, async_op, value_key(config, Config),
                                            self._tracing.enabled)
        if plan is None:
            self._check("broadcast", locals())
            self._plans.remember(key, _broadcast.broadcast(tensor, self._ctx, src=src, group=group, async_op=async_op,
                                                           config=config))

    def reduce_scatter(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None,
                       workspace=None):
        """Each member's part of the reduction over members; see :mod:`iris.ccl.reduce_scatter`."""
        key, plan = self._plans.replay_call("reduce_scatter", output_tensor, input_tensor, op, group, async_op,
                                            value_key(config, Config), workspace, self._tracing.enabled)
        if plan is None:
            self._check("reduce_scatter", locals())
            op = ReduceOp.SUM if op is None else op
            self._plans.remember(key, _reduce_scatter.reduce_scatter(output_tensor, input_tensor, self._ctx, op=op,
                                                                     group=group, async_op=async_op, config=config,
                                                                     workspace=workspace))

    def reduce(self, output_tensor, input_tensor=None, dst=0, op=None, group=None, async_op=False, config=None):
        """Rank ``dst``'s ``output_tensor`` = ``input_tensor`` (None: ``output_tensor``, in place) reduced over
        members; see :func:`iris.ccl.rooted.reduce`."""
        input_tensor = output_tensor if input_tensor is None else input_tensor
        key, plan = self._plans.replay_call("reduce", output_tensor, input_tensor, dst, op, group, async_op,
                                            value_key(config, Config), self._tracing.enabled)
        if plan is None:
            self._check("reduce", locals())
            op = ReduceOp.SUM if op is None else op
            self._plans.remember(key, _rooted.reduce(output_tensor, input_tensor, self._ctx, dst=dst, op=op,
                                                     group=group, async_op=async_op, config=config))

    def gather(self, output_tensor, input_tensor, dst=0, group=None, async_op=False, config=None):
        """Each member's (M, N) input into rank ``dst``'s (W*M, N) output; see :func:`iris.ccl.rooted.gather`."""
        key, plan = self._plans.replay_call("gather", output_tensor, input_tensor, dst, group, async_op,
                                            value_key(config, Config), self._tracing.enabled)
        if plan is None:
            self._check("gather", locals())
            self._plans.remember(key, _rooted.gather(output_tensor, input_tensor, self._ctx, dst=dst, group=group,
                                                     async_op=async_op, config=config))

    def scatter(self, output_tensor, input_tensor, src=0, group=None, async_op=False, config=None):
        """Block i of rank ``src``'s (W*M, N) input into member i's (M, N) output; see
        :func:`iris.ccl.rooted.scatter`."""
        key, plan = self._plans.replay_call("scatter", output_tensor, input_tensor, src, group, async_op,
                                            value_key(config, Config), self._tracing.enabled)
        if plan is None:
            self._check("scatter", locals())
            self._plans.remember(key, _rooted.scatter(output_tensor, input_tensor, self._ctx, src=src, group=group,
                                                      async_op=async_op, config=config))

    def send(self, tensor, dst, group=None, tag=0, config=None):
        """Store ``tensor`` into the tensor rank ``dst`` receives into; see :func:`iris.ccl.p2p.send`."""
        key, plan = self._plans.replay_call("send", tensor, None, dst, group, tag, value_key(config, Config))
        if plan is None:
            self._plans.remember(key, _p2p.send(tensor, self._ctx, dst, group=group, tag=tag, config=config))

    def recv(self, tensor, src, group=None, tag=0, config=None):
        """Receive rank ``src``'s next send into ``tensor`` (on the heap); see :func:`iris.ccl.p2p.recv`."""
        key, plan = self._plans.replay_call("recv", tensor, None, src, group, tag, value_key(config, Config))
        if plan is None:
            self._plans.remember(key, _p2p.recv(tensor, self._ctx, src, group=group, tag=tag, config=config))

    def sendrecv(self, send_tensor, recv_tensor, dst, src, group=None, tag=0, config=None):
        """Send to ``dst`` and receive from ``src`` at once (the receive posted first); see
        :func:`iris.ccl.p2p.sendrecv`."""
        key, plan = self._plans.replay_call("sendrecv", send_tensor, recv_tensor, dst, src, group, tag,
                                            value_key(config, Config))
        if plan is None:
            self._plans.remember(key, _p2p.sendrecv(send_tensor, recv_tensor, self._ctx, dst, src, group=group,
                                                    tag=tag, config=config))

    def moe_dispatcher(self, hidden_dim, num_experts, topk, max_tokens, group=None, config=None, expt_assignment=None,
                       dtype=torch.bfloat16, dispatch_dtype=None):
        """A :class:`MoEDispatcher` for this context (collective: it allocates its heap buffers); see
        :mod:`iris.ccl.moe`."""
        return MoEDispatcher(self._ctx, hidden_dim, num_experts, topk, max_tokens, group=group, config=config,
                             expt_assignment=expt_assignment, dtype=dtype, dispatch_dtype=dispatch_dtype)

    def barrier(self, group=None, async_op=False, config=None):
        """Every member of ``group`` waits for every other, on the device; see :func:`iris.ccl.barrier.barrier`."""
        if self._ctx.team.debug:  # every member made this call (the others are checked where not replayed)
            self._check("barrier", locals())
        _barrier.barrier(self._ctx, group=group, async_op=async_op, config=config)

    def all_reduce_rmsnorm(self, partial, residual, weight, eps=1e-6, group=None, async_op=False, config=None,
                           out=None, out_scale=None):
        """``residual += `` the sum over members of ``partial``; returns ``rmsnorm(residual) * weight``, in one
        kernel (into an fp8 ``out`` with per-token ``out_scale``); see :mod:`iris.ccl.fused_ar_rmsnorm`. Given
        ``out``, repeated calls relaunch their kernel."""
        key = None
        if out is not None:
            key, plan = self._plans.replay_call("all_reduce_rmsnorm", out, partial, residual.data_ptr(),
                                                None if out_scale is None else out_scale.data_ptr(),
                                                residual.shape, residual.dtype, weight.data_ptr(), weight.shape,
                                                weight.dtype, float(eps), group, async_op, self._tracing.enabled)
            if plan is not None:
                return out
        self._check("all_reduce_rmsnorm", locals())
        out = torch.empty_like(partial) if out is None else out
        self._plans.remember(key, _fused_ar_rmsnorm.launch(self._ctx, partial, residual, weight, eps, group,
                                                           async_op, out, out_scale))
        return out

    def all_reduce_preamble(self, output_tensor, input_tensor, config=None, workspace=None, group=None):
        """Checks and variant choice done once, for repeated all_reduce calls; see :mod:`iris.ccl.all_reduce`."""
        return _all_reduce.all_reduce_preamble(output_tensor, input_tensor, self._ctx, config=config,
                                               workspace=workspace, group=group)

    def all_reduce(self, output_tensor, input_tensor, op=None, group=None, async_op=False, config=None,
                   workspace=None):
        """Elementwise SUM/MAX/MIN over members, on every member; see :func:`iris.ccl.all_reduce.all_reduce`."""
        key, plan = self._plans.replay_call("all_reduce", output_tensor, input_tensor, op, group, async_op,
                                            value_key(config, Config), workspace, self._tracing.enabled)
        if plan is None:
            self._check("all_reduce", locals())
            op = ReduceOp.SUM if op is None else op
            self._plans.remember(key, _all_reduce.all_reduce(output_tensor, input_tensor, self._ctx, op=op,
                                                             group=group, async_op=async_op, config=config,
                                                             workspace=workspace))
