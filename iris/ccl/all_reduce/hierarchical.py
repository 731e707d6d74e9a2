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
on other nodes (iris.device.nvshmem), the others by pointers. Floats sum in float32 inside each step
and are rounded to the data's dtype between steps.

Which node a member is on: ``Config.hierarchy`` (one number per member), else the context's node map.
The default variant is this one when the group spans several nodes with the same number of members
each, more than one (:func:`iris.ccl.hierarchy.pays`; the teams: :func:`iris.ccl.hierarchy.teams`).

Example:
    >>> config = iris.ccl.Config(all_reduce_variant="hierarchical", hierarchy=(0, 0, 1, 1))
    >>> ctx.ccl.all_reduce(out, x, config=config)   # 4 ranks: {0, 1} and {2, 3} reduce first
"""

from __future__ import annotations

import dataclasses

from iris.ccl import all_gather, reduce_scatter


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
        inside = dataclasses.replace(config, hierarchy=None)  # the node team's steps: one node
        # no barrier after the reduce: the node's next step (the gather's) starts with one
        launches += reduce_scatter.reduce_scatter(part, head_in, ctx, op=op, group=node_team, async_op=True,
                                                  config=inside)
        if len(cross_team) > 1:
            across = dataclasses.replace(config, all_reduce_variant=None, hierarchy=tuple(range(len(cross_team))))
            launches += flat_all_reduce(part, part, ctx, op=op, group=cross_team, config=across)
        launches += all_gather.all_gather(head_out, part, ctx, group=node_team, async_op=async_op, config=inside)
    return launches
