"""barrier: every member of a group waits for the others, on the device (``ctx.ccl.barrier``).

The context's device barrier (:meth:`iris.Iris.device_barrier`) as a collective: what any member wrote
before it is visible to every member after it; the host does not wait, and a CUDA graph can replay it.
"""

from __future__ import annotations

from iris.ccl import _common


def barrier(ctx, group=None, async_op: bool = False, config=None) -> None:
    """Every member of ``group`` waits here, on the device, for every other. ``async_op`` changes nothing (it is
    in stream order either way); ``config`` is checked, not needed. The counters stay on the context as
    ``ctx._ccl_barrier_state[group]``.

    Example:
        >>> ctx.ccl.barrier()            # every member's earlier writes are visible to every member from here on
    """
    _common.config_or_default(config)
    ctx.heap.refuse_if_closed("ccl.barrier")
    ctx.team.participants(group)  # checked: the group, and this rank in it
    state = getattr(ctx, "_ccl_barrier_state", None)
    if state is None:
        state = {}
        ctx._ccl_barrier_state = state
    if group not in state:
        state[group] = ctx.team.barrier.arguments(group)[0]
    ctx.team.barrier(group)
    ctx.team.diagnose_now_in_debug()
