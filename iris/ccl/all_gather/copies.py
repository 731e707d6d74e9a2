"""all_gather by copies (``Config(all_gather_variant="copies")``): each member's input goes into every member's
output by the copy engine (an asynchronous copy on the current stream per member, into the member's heap), between
two barriers of the group; no SM moves data, so a kernel running beside it on another stream keeps them all.

Example:
    >>> out = ctx.empty(ctx.get_num_ranks() * 4096, 4096)
    >>> ctx.ccl.all_gather(out, x, config=iris.ccl.Config(all_gather_variant="copies"))
"""

from __future__ import annotations

from iris.ccl import _common


def launch(ctx, output, input, members, group, async_op: bool) -> list:
    """The copies of checked tensors between the group's barriers (see :func:`iris.ccl._common.run_copies`)."""
    heap, index, copy = ctx.team.heap, members.index, ctx.backend.copy
    nbytes = input.numel() * input.element_size()

    def send(output, input) -> None:  # this member's slot of every member's output, from the next member on
        slot = output.data_ptr() + index * nbytes
        for step in range(members.size):
            copy(heap.peer_address(slot, members.ranks[(index + step) % members.size]), input.data_ptr(), nbytes)

    return _common.run_copies(ctx, "all_gather", members, group, async_op, send, output, input)
