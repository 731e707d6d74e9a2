"""all_gather: every member's (M, N) input, stacked by group index into everyone's (W*M, N) output.

The front door: checks, then the variant (``Config.all_gather_variant``): "persistent", "partitioned" and
"persistent_inline" (:mod:`~iris.ccl.all_gather.direct`: each member stores its pieces into every
member's output, hierarchically for members on several nodes), "ring" (:mod:`~iris.ccl.all_gather.ring`) or
"copies" (:mod:`~iris.ccl.all_gather.copies`: the copy engine, no SM). ``Config.cache_modifier`` goes to
the stores into the members' outputs when it is a store's (".wb", ".cg", ".cs", ".wt").

Example:
    >>> out = ctx.empty(ctx.get_num_ranks() * 128, 64)
    >>> ctx.ccl.all_gather(out, ctx.ones(128, 64))
"""

from __future__ import annotations

import torch

from iris.ccl import _common
from iris.ccl.all_gather import copies, direct, ring
from iris.ccl.all_gather.direct import _all_gather_kernel, piece_of_repeat, store_to_members  # noqa: F401
from iris.ccl.all_gather.ring import AllGatherWorkspace
from iris.ccl.config import STORE_CACHE_MODIFIERS


def all_gather_preamble(output, input, ctx, config=None, workspace=None, group=None) -> AllGatherWorkspace:
    """Make (or reuse: its flags kept where big enough) the :class:`AllGatherWorkspace` of repeated calls on
    ``output`` and ``input``, so that no call allocates; collective (every member calls it alike).

    Example:
        >>> workspace = ctx.ccl.all_gather_preamble(out, x, config=Config(all_gather_variant="ring"))
    """
    config = _common.config_or_default(config)
    members = _check(ctx, output, input, group)
    if workspace is None:
        workspace = AllGatherWorkspace()
    if not isinstance(workspace, AllGatherWorkspace):
        raise TypeError(f"all_gather: workspace must be an iris.ccl.all_gather.AllGatherWorkspace, got "
                        f"{type(workspace).__name__}")
    workspace.variant, workspace.shape, workspace.dtype = config.all_gather_variant, tuple(input.shape), input.dtype
    if config.all_gather_variant == "ring":
        need = ring.flags_needed(members.size, input.numel(), config)
        if workspace.flags is None or workspace.flags.numel() < need:
            workspace.flags = ctx.zeros(need, dtype=torch.int32)
    workspace.prepared = True
    return workspace


def _check(ctx, output, input, group):
    what = "all_gather"
    ctx.team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=False)
    ctx.team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=True)
    members = ctx.team.participants(group)
    if output.dtype != input.dtype or output.numel() != members.size * input.numel():
        raise ValueError(f"{what}: output must hold {members.size} x input ({members.size * input.numel()} "
                         f"{input.dtype} elements, shape ({members.size}*M, N)); got {tuple(output.shape)} "
                         f"{output.dtype} for input {tuple(input.shape)}")
    return members


def all_gather(output, input, ctx, group=None, async_op=False, config=None, workspace=None):
    """Like ``torch.distributed.all_gather_into_tensor``: ``output[i*M:(i+1)*M] = input`` of member i.

    Args:
        output: (W*M, N) on the symmetric heap (written by every member); W = group size.
        input: (M, N), any device tensor of this rank (read locally).
        ctx: the Iris context.
        group: a torch.distributed group of the participating ranks, or None for all.
        async_op: False: ends with a device barrier (every output complete in stream order); True: none
            (``ctx.device_barrier(group)`` before reading ``output`` or reusing the buffers).
        config: an :class:`iris.ccl.Config` (``block_size``, ``all_gather_variant``, ``cache_modifier``).
        workspace: the ring's :class:`AllGatherWorkspace` (None: one the context keeps for the size).

    Returns:
        The launches, bound (``ctx.ccl`` replays them).
    """
    config = _common.config_or_default(config)
    members = _check(ctx, output, input, group)
    cache = config.cache_modifier if config.cache_modifier in STORE_CACHE_MODIFIERS else ""
    if config.all_gather_variant == "ring":
        flags = None if workspace is None else all_gather_preamble(output, input, ctx, config, workspace, group).flags
        return ring.launch(ctx, output, input, members, group, async_op, config, cache, flags)
    if config.all_gather_variant == "copies":
        return copies.launch(ctx, output, input, members, group, async_op)
    return direct.launch(ctx, output, input, members, group, async_op, config, cache)
