"""all_reduce: every member's output is the elementwise SUM (MAX, MIN) of all members' inputs.

The front door: checks, the variant (``Config.all_reduce_variant``, else :mod:`~iris.ccl.all_reduce.choice`)
and its launch. Each variant's module declares a :class:`~iris.ccl.all_reduce.variant.Variant` and says
when it pays: one_shot, two_shot, atomic, spinlock, ring (one kernel: :mod:`~iris.ccl.all_reduce.kernel`),
push and ll (:mod:`~iris.ccl.all_reduce.push`), hierarchical.

Example:
    >>> ctx.ccl.all_reduce(x, x)                                           # in place, the default variant
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="ll"))
"""

from __future__ import annotations

import functools

import torch

from iris.ccl import _common, hierarchy
from iris.ccl.all_reduce.choice import DTYPE_NAMES, ELEMENT_SIZES, FLAT, choose_variant, default_variant  # noqa: F401
from iris.ccl.all_reduce.hierarchical import HIERARCHICAL
from iris.ccl.all_reduce.two_shot import writes_halves  # noqa: F401
from iris.ccl.all_reduce.variant import AllReduceWorkspace
from iris.ccl.config import CollectiveConfig, ReduceOp

VARIANTS = {**FLAT, HIERARCHICAL.name: HIERARCHICAL}
# The variants by fact, as their modules declare them (iris.ops's pipelined all_reduce reads these two).
IN_PLACE = tuple(name for name, variant in VARIANTS.items() if variant.in_place)
BARRIER_FREE = tuple(name for name, variant in VARIANTS.items() if variant.barrier_free)


def far_path_refusal(variant: str, across_nodes: bool) -> str | None:
    """Why ``variant`` is refused for members on several nodes (``across_nodes``), or None where it runs."""
    reason = VARIANTS[variant].far_path_refusal if across_nodes and variant in VARIANTS else None
    if reason is None:
        return None
    return (f"all_reduce: the {variant} variant is refused for members on several nodes (each access to another "
            f"node one of the transport's device calls): {reason}; leave all_reduce_variant unset (the default) "
            "or use two_shot")


def input_on_heap(variant: str, engine: bool) -> bool:
    """Whether ``variant`` needs its input on the symmetric heap (push and ll need not copy a tensor into it);
    ``engine``: ``ctx.team.heap_reaches_by_engine``."""
    return VARIANTS[variant].input_on_heap(engine)


@functools.lru_cache(maxsize=256)
def _local_output_config(nbytes: int, world_size: int, dtype) -> CollectiveConfig | None:
    variant = choose_variant(nbytes, False, world_size, dtype)
    return CollectiveConfig(all_reduce_variant=variant) if VARIANTS[variant].local_output else None


def all_reduce_to_new(tensor, ctx, stage, op=ReduceOp.SUM, group=None) -> torch.Tensor:
    """The all-reduce of ``tensor`` as a new tensor (an out-of-place API's), ``tensor`` unchanged; ``stage(t)``
    copies ``t`` into a heap buffer made once. Small sizes write straight into a new tensor (staged only where
    the variant needs its input on the heap); larger ones run in place in the stage, then clone. Nothing is
    allocated on the heap, so a CUDA graph can capture it.

    Example:
        >>> buffer = ctx.empty(16, 4096, dtype=torch.bfloat16)   # made once
        >>> out = all_reduce_to_new(x, ctx, stage=buffer.copy_)
    """
    world_size = ctx.get_num_ranks() if group is None else torch.distributed.get_world_size(group)
    config = _local_output_config(tensor.numel() * tensor.element_size(), world_size, tensor.dtype)
    if config is not None:
        out = torch.empty_like(tensor)
        source = stage(tensor) if input_on_heap(config.all_reduce_variant, ctx.team.heap_reaches_by_engine) else tensor
        ctx.ccl.all_reduce(out, source, op=op, group=group, config=config)
        return out
    staged = stage(tensor)
    ctx.ccl.all_reduce(staged, staged, op=op, group=group)
    return staged.clone()


def all_reduce_preamble(output, input, ctx, config=None, workspace=None, group=None) -> AllReduceWorkspace:
    """Check the tensors and resolve the variant once; pass the result as ``workspace=`` to reuse it."""
    config = _common.config_or_default(config)
    what, team = "all_reduce", ctx.team
    team.check_tensor(what, "input", input, _common.REDUCE_DTYPES, symmetric=False)
    if output.shape != input.shape or output.dtype != input.dtype:
        raise ValueError(f"{what}: output must match input's shape and dtype; got output {tuple(output.shape)} "
                         f"{output.dtype}, input {tuple(input.shape)} {input.dtype}")
    if workspace is not None:
        group = workspace.group
    members = team.participants(group)
    in_place = input.numel() > 0 and output.data_ptr() == input.data_ptr()
    nodes = hierarchy.nodes_of_members(ctx, config, members, what)
    name = config.all_reduce_variant or default_variant(nodes, input, in_place, members.size)
    variant, across_nodes = VARIANTS[name], len(set(nodes)) > 1
    refusal = far_path_refusal(name, across_nodes)
    if refusal is not None:
        raise ValueError(refusal)
    if in_place and not variant.in_place:
        raise ValueError(f"all_reduce: {name} cannot run in place (other members still read input while it "
                         "would be overwritten); use Config(all_reduce_variant=\"two_shot\") or a separate output")
    if variant.check is not None:
        variant.check(input)
    team.check_tensor(what, "input", input, _common.REDUCE_DTYPES,
                      symmetric=variant.input_on_heap(team.heap_reaches_by_engine))
    team.check_tensor(what, "output", output, _common.REDUCE_DTYPES, symmetric=not variant.local_output)
    teams = hierarchy.teams(members.ranks, nodes, ctx.get_rank()) if variant is HIERARCHICAL else None
    return AllReduceWorkspace(name, group, members, teams, across_nodes, spec=variant)


def all_reduce(output, input, ctx, op=ReduceOp.SUM, group=None, async_op=False, config=None, workspace=None):
    """``output = op(input of every member)``, elementwise, on every member.

    Args:
        output: shape and dtype of ``input``; on the heap unless the variant writes only this member's
            (one_shot, push, ll); ``input`` itself where the variant runs in place (two_shot, push, ll,
            hierarchical).
        input: on the heap where other members read it (all variants but push and ll).
        ctx, op, config: the Iris context, ReduceOp.SUM (default), MAX or MIN, an :class:`iris.ccl.Config`.
        group, async_op: as for :func:`iris.ccl.all_gather.all_gather` (async_op: barrier before changing
            ``input`` again).
        workspace: from :func:`all_reduce_preamble`, to skip the checks on repeated calls.

    Returns:
        The launches, bound (``ctx.ccl`` replays them).

    Example:
        >>> x = ctx.ones(1 << 20, dtype=torch.bfloat16)
        >>> ctx.ccl.all_reduce(x, x)          # in place: x == world size everywhere
    """
    op = ReduceOp(op) if not isinstance(op, ReduceOp) else op
    config = _common.config_or_default(config)
    if workspace is None:
        workspace = all_reduce_preamble(output, input, ctx, config, group=group)
    elif group is not None and group is not workspace.group:
        raise ValueError("all_reduce: the workspace was prepared for another group; prepare one per group")
    return workspace.spec.launch(ctx, output, input, op, config, workspace, async_op)
