"""all_reduce over several nodes: reduce inside each node, across nodes only each node's slice, gather back.

With G members on each of N nodes and S elements per member, the flat variants send about
2 (W - 1) / W x S per member over whatever joins the two members, the network included. Here:

1. reduce_scatter inside the node (its team: the node's members, in member order): member i of the
   node gets chunk i (S / G elements) summed over the node;
2. all_reduce of chunk i across nodes, among the members that are i-th on their node (the cross
   team: one per node): 2 (N - 1) / N x S / G per member over the network;
3. all_gather inside the node: every member gets every chunk.

So the network carries 1 / G of what a flat all_reduce puts on it, and the node's links the rest (the
cost model: docs/multi-node.md). The S mod G elements past the last whole chunk are reduced by a flat
all_reduce of the whole group first. Each step is one of Iris's collectives over a team (a tuple of
global ranks): the step across nodes reaches its peers through the shmem heap's engine when they are
on other nodes (iris.device.engine), the others by pointers. Floats sum in float32 inside each step
and are rounded to the data's dtype between steps.

Which node a member is on: ``Config.hierarchy`` (one number per member), else the context's node map.
The default variant is this one when the group spans several nodes with the same number of members
each, more than one (:func:`pays`).

Example:
    >>> config = iris.ccl.Config(all_reduce_variant="hierarchical", hierarchy=(0, 0, 1, 1))
    >>> ctx.ccl.all_reduce(out, x, config=config)   # 4 ranks: {0, 1} and {2, 3} reduce first
"""

from __future__ import annotations

import dataclasses

from iris.ccl import all_gather, reduce_scatter


def _members_by_node(nodes: tuple[int, ...], ranks: tuple[int, ...]) -> dict[int, list[int]]:
    by_node: dict[int, list[int]] = {}
    for rank, node in zip(ranks, nodes):
        by_node.setdefault(node, []).append(rank)
    return by_node


def teams(ranks: tuple[int, ...], nodes: tuple[int, ...], rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(the node team, the cross team) of ``rank`` among members ``ranks`` on ``nodes`` (one per member).

    The node team is ``rank``'s node's members in member order; the cross team, the members that
    are at the same place on their node as ``rank`` on its own, one per node in order of first
    appearance.

    Raises:
        ValueError: ``nodes`` is not one per member, or the nodes hold different numbers of members.

    Example:
        >>> teams((0, 1, 2, 3), (0, 0, 1, 1), rank=2)
        ((2, 3), (0, 2))
    """
    if len(nodes) != len(ranks):
        raise ValueError(f"all_reduce (hierarchical): one node per member: got {len(nodes)} for {len(ranks)} "
                         f"members (Config.hierarchy, or the context's node map)")
    by_node = _members_by_node(nodes, ranks)
    sizes = {len(members) for members in by_node.values()}
    if len(sizes) > 1:
        counts = ", ".join(f"node {node} has {len(members)}" for node, members in by_node.items())
        raise ValueError(f"all_reduce (hierarchical): {counts} members; each node needs the same number (each "
                         "member's slice is reduced across nodes with its counterparts); use a flat variant")
    node_team = tuple(by_node[nodes[ranks.index(rank)]])
    place = node_team.index(rank)
    return node_team, tuple(members[place] for members in by_node.values())


def pays(nodes: tuple[int, ...]) -> bool:
    """Whether the hierarchical all_reduce is the default for members on ``nodes``: several nodes, the
    same number of members on each, more than one (one per node: the flat all_reduce moves the same)."""
    sizes = {len(members) for members in _members_by_node(nodes, nodes).values()}
    return len(sizes) == 1 and sizes.pop() > 1 and len(set(nodes)) > 1


def launch(ctx, output, input, op, config, group, node_team, cross_team, async_op, flat_all_reduce) -> list:
    """Run the steps (module doc) on the current stream; returns their launches, bound.

    ``flat_all_reduce`` is :func:`iris.ccl.all_reduce.all_reduce` (passed in: that module chooses this
    one), with which the cross step (its variant chosen by size, its members each on a node of their
    own) and the tail (two_shot: fewer elements than a node has members, in place or not) run.
    """
    numel = input.numel()
    size = len(node_team)
    chunk = numel // size
    flat_in, flat_out = input.reshape(-1), output.reshape(-1)
    launches = []
    if numel % size:  # the tail past the last whole chunk (all of it when a chunk would be empty)
        tail = dataclasses.replace(config, all_reduce_variant="two_shot", hierarchy=None)
        launches += flat_all_reduce(flat_out[size * chunk:], flat_in[size * chunk:], ctx, op=op, group=group,
                                    async_op=async_op and not chunk, config=tail)
    if chunk:
        head_in, head_out = flat_in[:size * chunk], flat_out[:size * chunk]
        place = node_team.index(ctx.get_rank())
        part = head_out[place * chunk:(place + 1) * chunk]  # this member's chunk, where the result keeps it
        # no barrier after the reduce: the node's next step (the gather's) starts with one
        launches += reduce_scatter.reduce_scatter(part, head_in, ctx, op=op, group=node_team, async_op=True,
                                                  config=config)
        if len(cross_team) > 1:
            across = dataclasses.replace(config, all_reduce_variant=None, hierarchy=tuple(range(len(cross_team))))
            launches += flat_all_reduce(part, part, ctx, op=op, group=cross_team, config=across)
        launches += all_gather.all_gather(head_out, part, ctx, group=node_team, async_op=async_op, config=config)
    return launches
