"""Members on nodes: the teams the hierarchical collectives run over, and when a hierarchy pays.

A member's node comes from ``Config.hierarchy`` (one number per member), else the context's node map. A
hierarchical collective runs a step among each node's members (the node team) and one among the members
at the same place on their nodes (the cross team), so the network carries only the cross step's traffic.

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
    """The node of each of ``members``: ``config.hierarchy`` (ValueError unless one per member), else the node map."""
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
    """(node team, cross team) of ``rank`` among ``ranks`` on ``nodes``: its node's members in member order, and
    the members at its place on each node, in order of first appearance. ValueError unless ``nodes`` is one per
    member and the nodes hold as many members each."""
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
    """Whether a hierarchical collective is the default on ``nodes``: several, as many members on each, more
    than one (with one per node the flat collective moves the same)."""
    sizes = {len(members) for members in _members_by_node(nodes, nodes).values()}
    return len(sizes) == 1 and sizes.pop() > 1 and len(set(nodes)) > 1


def blocked(nodes: tuple[int, ...]) -> bool:
    """Whether the nodes' members are consecutive in member order, as many on each (torchrun's numbering)."""
    by_node = _members_by_node(nodes, tuple(range(len(nodes))))
    sizes = {len(members) for members in by_node.values()}
    return len(sizes) == 1 and all(members == list(range(members[0], members[0] + len(members)))
                                   for members in by_node.values())


def dealt(nodes: tuple[int, ...]) -> bool:
    """Whether members are dealt to the nodes in turn, member g on the (g mod N)-th of N nodes (round-robin)."""
    count = len(set(nodes))
    return len(nodes) % count == 0 and len(set(nodes[:count])) == count and \
        all(node == nodes[g % count] for g, node in enumerate(nodes))


@functools.lru_cache(maxsize=64)
def arrangement(nodes: tuple[int, ...]) -> str | None:
    """How a hierarchical all_gather or reduce_scatter runs on ``nodes``: "blocked", "dealt", or None (flat)."""
    if not pays(nodes):
        return None
    return "blocked" if blocked(nodes) else "dealt" if dealt(nodes) else None
