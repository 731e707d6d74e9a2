"""broadcast: the source member's tensor, copied into the same tensor of every member."""

from __future__ import annotations

import triton

from iris.ccl import _common
from iris.ccl.all_gather import _all_gather_kernel


def broadcast(tensor, ctx, src=0, group=None, async_op=False, config=None):
    """Overwrite ``tensor`` (on the heap) on every member with global rank ``src``'s, as
    ``torch.distributed.broadcast``; ``group``, ``async_op``, ``config`` as for all_gather.

    Example:
        >>> weights = ctx.zeros(1024)
        >>> ctx.ccl.broadcast(weights, src=0)
    """
    config = _common.config_or_default(config)
    ctx.team.check_tensor("broadcast", "tensor", tensor, _common.MOVE_DTYPES, symmetric=True)
    members = ctx.team.participants(group)
    if src not in members.ranks:
        raise ValueError(f"broadcast: src={src!r} is not a member of the group {list(members.ranks)}")
    numel = tensor.numel()
    # all_gather's kernel with index 0 (every member's same slot), work only on the source; all take the barriers
    pieces = triton.cdiv(numel, config.block_size)
    return _common.run(ctx, group, async_op, _common.fuse(config, tensor.nbytes), _all_gather_kernel,
                       pieces if ctx.get_rank() == src else 0, tensor, tensor, numel, numel, 0, 0, members.tensor,
                       members.size, 0, ctx.get_rank(), ctx.get_heap_bases(), fused_programs=pieces,
                       CACHE="", BLOCK=config.block_size)
