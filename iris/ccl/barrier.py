"""barrier: the original's ``ctx.ccl.barrier``, every member of a group waiting for the others, on the device.

It is the context's device barrier (:meth:`iris.Iris.device_barrier`): one small kernel on the current stream,
each member announcing its arrival with a release and waiting for every other's with an acquire, so what any
member wrote before it (earlier kernels on its stream) is visible to every member after it. The host does not
wait, and the call can be captured in a CUDA graph and replayed (its counters live on the heap: every replay
is a new round).
"""

from __future__ import annotations

from iris.ccl import _common


def barrier(ctx, group=None, async_op: bool = False, config=None) -> None:
    """Every member of ``group`` waits here, on the device, for every other.

    Args:
        ctx: the Iris context.
        group: a torch.distributed group of the participating ranks, or None for all.
        async_op: the original's argument. Iris's barrier never makes the host wait, so False and True
            are the same: the barrier is in stream order either way (synchronize the stream to wait on
            the host).
        config: an :class:`iris.ccl.Config` or None; checked, not needed (the barrier moves no data).

    The counters it uses are kept on the context as ``ctx._ccl_barrier_state[group]`` (the original's
    name): the same heap tensor on every call.

    Example:
        >>> buf.fill_(float(ctx.get_rank()))
        >>> ctx.ccl.barrier()            # every member's fill is visible to every member from here on
        >>> read_a_peers_buf[(1,)](buf, ...)
    """
    _common.config_or_default(config)
    ctx.team.participants(group)  # checked: the group, and this rank in it
    state = getattr(ctx, "_ccl_barrier_state", None)
    if state is None:
        state = {}
        ctx._ccl_barrier_state = state
    if group not in state:
        state[group] = ctx.team.barrier.arguments(group)[0]
    ctx.team.barrier(group)
    ctx.team.diagnose_now_in_debug()
