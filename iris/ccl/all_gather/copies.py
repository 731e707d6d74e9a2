"""all_gather by copies (``Config(all_gather_variant="copies")``): each member's input goes into every member's
output by the copy engine (an asynchronous copy on the current stream per member, into the member's heap), between
two barriers of the group; no SM moves data, so a kernel running beside it on another stream keeps them all.

Example:
    >>> out = ctx.empty(ctx.get_num_ranks() * 4096, 4096)
    >>> ctx.ccl.all_gather(out, x, config=iris.ccl.Config(all_gather_variant="copies"))
"""

from __future__ import annotations

from iris.host.replay import weakly_held


def launch(ctx, output, input, members, group, async_op: bool) -> list:
    """The copies of checked tensors between the group's barriers (the second unless ``async_op``); returns the
    launches, run once here (``ctx.ccl`` replays them)."""
    team = ctx.team
    heap = team.heap
    if not heap.maps(members.ranks):
        raise ValueError("all_gather: Config(all_gather_variant='copies') copies into every member's heap, and a "
                         "member here is reached only through the engine (another node); use another variant")
    index, nbytes, copy = members.index, input.numel() * input.element_size(), ctx.backend.copy

    def send(output, input) -> None:  # this member's slot of every member's output, from the next member on
        slot = output.data_ptr() + index * nbytes
        for step in range(members.size):
            copy(heap.peer_address(slot, members.ranks[(index + step) % members.size]), input.data_ptr(), nbytes)

    launches = [team.barrier.launch(group), weakly_held(send, output, input)]
    if not async_op:
        launches.append(team.barrier.launch(group))
    for each in launches:
        each()
    team.diagnose_now_in_debug()
    return launches
