"""all_reduce over several nodes: reduce inside each node, across nodes only each node's slice, gather back.

With G members on each node: reduce_scatter inside the node (member i gets chunk i), the flat all_reduce of
chunk i across nodes among the members i-th on their node (the cross team), all_gather inside the node. The
network carries 1 / G of a flat all_reduce's traffic (docs/multi-node.md); the elements past the last whole
chunk go by two_shot first; floats round to the data's dtype between steps.

Example:
    >>> config = iris.ccl.Config(all_reduce_variant="hierarchical", hierarchy=(0, 0, 1, 1))
    >>> ctx.ccl.all_reduce(out, x, config=config)   # 4 ranks: {0, 1} and {2, 3} reduce first
"""

from __future__ import annotations

import dataclasses

from iris.ccl import all_gather, hierarchy, reduce_scatter
from iris.ccl.all_reduce.choice import FLAT, default_variant
from iris.ccl.all_reduce.variant import AllReduceWorkspace, Variant


def _flat(ctx, output, input, op, config, group, variant: str, async_op: bool, across_nodes: bool) -> list:
    spec = FLAT[variant]
    workspace = AllReduceWorkspace(variant, group, ctx.team.participants(group), across_nodes=across_nodes, spec=spec)
    return spec.launch(ctx, output, input, op, config, workspace, async_op)


def launch(ctx, output, input, op, config, workspace, async_op: bool) -> list:
    node_team, cross_team = workspace.teams
    numel = input.numel()
    size = len(node_team)
    chunk = numel // size
    flat_in, flat_out = input.reshape(-1), output.reshape(-1)
    launches = []
    if numel % size:  # the tail past the last whole chunk (all of it when a chunk would be empty)
        tail = dataclasses.replace(config, all_reduce_variant="two_shot", hierarchy=None)
        nodes = hierarchy.nodes_of_members(ctx, tail, workspace.members, "all_reduce")
        launches += _flat(ctx, flat_out[size * chunk:], flat_in[size * chunk:], op, tail, workspace.group, "two_shot",
                          async_op and not chunk, len(set(nodes)) > 1)
    if chunk:
        head_in, head_out = flat_in[:size * chunk], flat_out[:size * chunk]
        place = node_team.index(ctx.get_rank())
        part = head_out[place * chunk:(place + 1) * chunk]  # this member's chunk, where the result keeps it
        inside = dataclasses.replace(config, hierarchy=None)  # the node team's steps: one node
        # no barrier after the reduce: the node's next step (the gather's) starts with one
        launches += reduce_scatter.reduce_scatter(part, head_in, ctx, op=op, group=node_team, async_op=True,
                                                  config=inside)
        if len(cross_team) > 1:  # each member on a node of its own
            across = dataclasses.replace(config, all_reduce_variant=None, hierarchy=tuple(range(len(cross_team))))
            variant = default_variant(across.hierarchy, part, True, len(cross_team))
            launches += _flat(ctx, part, part, op, across, cross_team, variant, False, True)
        launches += all_gather.all_gather(head_out, part, ctx, group=node_team, async_op=async_op, config=inside)
    return launches


HIERARCHICAL = Variant("hierarchical", launch, in_place=True)
