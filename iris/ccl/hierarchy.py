"""Members on nodes: the teams the hierarchical collectives run over, and when a hierarchy pays.

Which node a member is on comes from ``Config.hierarchy`` (one number per member, any grouping), else
the context's node map. A hierarchical collective runs a step among the members of each node (the
node team) and a step among the members at the same place on their nodes (the cross team: one per
node), so the network carries only the cross step's traffic (docs/multi-node.md). Used by
:mod:`iris.ccl.all_reduce.hierarchical`, :func:`iris.ccl.all_gather.all_gather` and
:mod:`iris.ccl.reduce_scatter`.

Example:
    >>> teams((0, 1, 2, 3), (0, 0, 1, 1), rank=2)
    ((2, 3), (0, 2))
    >>> pays((0, 0, 1, 1)), blocked((0, 1, 0, 1))
    (True, False)
"""

from __future__ import annotations

import functools


def _members_by_node(nodes: tuple[int, ...], ranks: tuple[int, ...]) -> dict[int, list[int]]:
    by_node: dict[int, list[int]] = {}
    for rank, node in zip(ranks, nodes):
        by_node.setdefault(node, []).append(rank)
    return by_node


def nodes_of_members(ctx, config, members, what: str) -> tuple[int, ...]:
    """The node of each member of ``members`` (:class:`iris.host.team.Participants`): ``config.hierarchy``,
    else the context's node map. Raises ValueError when the hierarchy is not one node per member."""
    if config.hierarchy is not None:
        if len(config.hierarchy) != members.size:  # before a default's choice reads it
            raise ValueError(f"{what}: Config.hierarchy names {len(config.hierarchy)} nodes; the group has "
                             f"{members.size} members (one node per member)")
        return config.hierarchy
    nodes = ctx.get_node_map()
    return tuple(nodes[rank] for rank in members.ranks)


@functools.lru_cache(maxsize=64)  # asked on every call not replayed, of the same few layouts
def teams(ranks: tuple[int, ...], nodes: tuple[int, ...], rank: int,
          what: str = "all_reduce (hierarchical)") -> tuple[tuple[int, ...], tuple[int, ...]]:
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
        raise ValueError(f"{what}: one node per member: got {len(nodes)} for {len(ranks)} "
                         f"members (Config.hierarchy, or the context's node map)")
    by_node = _members_by_node(nodes, ranks)
    sizes = {len(members) for members in by_node.values()}
    if len(sizes) > 1:
        counts = ", ".join(f"node {node} has {len(members)}" for node, members in by_node.items())
        raise ValueError(f"{what}: {counts} members; each node needs the same number (each "
                         "member's slice is reduced across nodes with its counterparts); use a flat variant")
    node_team = tuple(by_node[nodes[ranks.index(rank)]])
    place = node_team.index(rank)
    return node_team, tuple(members[place] for members in by_node.values())


def pays(nodes: tuple[int, ...]) -> bool:
    """Whether a hierarchical collective is the default for members on ``nodes``: several nodes, the same
    number of members on each, more than one (one per node: the flat collective moves the same)."""
    sizes = {len(members) for members in _members_by_node(nodes, nodes).values()}
    return len(sizes) == 1 and sizes.pop() > 1 and len(set(nodes)) > 1


def blocked(nodes: tuple[int, ...]) -> bool:
    """Whether each node's members are consecutive in member order, the nodes of one size (as torchrun and
    Slurm number ranks node by node): the layout whose gathered blocks a strided step can place."""
    by_node = _members_by_node(nodes, tuple(range(len(nodes))))
    sizes = {len(members) for members in by_node.values()}
    return len(sizes) == 1 and all(members == list(range(members[0], members[0] + len(members)))
                                   for members in by_node.values())


def dealt(nodes: tuple[int, ...]) -> bool:
    """Whether members are dealt to the nodes in turn, member g on the (g mod N)-th of N nodes (as a job
    numbered round-robin over its nodes): each place's members (one per node) are then consecutive in
    member order, the layout whose gathered blocks a cross step places in one run.

    Example:
        >>> dealt((0, 1, 0, 1)), dealt((0, 0, 1, 1))
        (True, False)
    """
    count = len(set(nodes))
    return len(nodes) % count == 0 and len(set(nodes[:count])) == count and \
        all(node == nodes[g % count] for g, node in enumerate(nodes))


@functools.lru_cache(maxsize=64)
def arrangement(nodes: tuple[int, ...]) -> str | None:
    """How a hierarchical all_gather or reduce_scatter runs over members on ``nodes``: "blocked" (members
    in node blocks), "dealt" (dealt to the nodes in turn), or None (flat: the hierarchy does not pay, or
    the layout is neither).

    Example:
        >>> arrangement((0, 0, 1, 1)), arrangement((0, 1, 0, 1)), arrangement((0, 1, 1, 0))
        ('blocked', 'dealt', None)
    """
    if not pays(nodes):
        return None
    return "blocked" if blocked(nodes) else "dealt" if dealt(nodes) else None
