"""all_gather: every member's (M, N) input, stacked by group index into everyone's (W*M, N) output."""

from __future__ import annotations

import triton
import triton.language as tl

from iris.device import rma, tracing
from iris.ccl import _common
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes


@triton.jit
def _all_gather_piece(pid, trace, src, dst, numel, members, count, index, cur, heap_bases, BLOCK: tl.constexpr):
    span = trace.start(tracing.PUT, cur, -1, dst, pid, -1, elements_bytes(dst, count * BLOCK))
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    data = tl.load(src + offs, mask=mask)
    slot = dst + tl.cast(index, tl.int64) * numel + offs
    store_to_members(slot, data, members, count, index, cur, heap_bases, mask)  # from a different peer on each
    trace.end(span)


@triton.jit
def store_to_members(slot, data, members, count, start, cur, heap_bases, mask):
    """Store ``data`` at ``slot`` on every member (this one included), from member ``start`` on. In a job
    across nodes (the engine path) the block is stored here first and put from here: one block transfer
    per peer toward another node, instead of one engine store per element."""
    if rma.ENGINE:
        tl.store(slot, data, mask=mask)
    for i in range(0, count):
        peer = tl.load(members + (start + i) % count)
        if rma.ENGINE:
            if peer != cur:
                rma.put(slot, slot, cur, peer, heap_bases, mask=mask)
        else:
            rma.store(slot, data, cur, peer, heap_bases, mask=mask)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_gather_kernel(src, dst, numel, members, count, index, cur, heap_bases, arrivals, expected, programs,
                       FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                       BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, BLOCK: tl.constexpr):
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _all_gather_piece(pid, trace, src, dst, numel, members, count, index, cur, heap_bases, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def all_gather(output, input, ctx, group=None, async_op=False, config=None):
    """Like ``torch.distributed.all_gather_into_tensor``: ``output[i*M:(i+1)*M] = input`` of member i.

    Args:
        output: (W*M, N) on the symmetric heap (written by every member); W = group size.
        input: (M, N), any device tensor of this rank (read locally).
        ctx: the Iris context.
        group: a torch.distributed group of the participating ranks, or None for all.
        async_op: False: returns after a device barrier, so every member's output is complete
            in stream order; True: no barrier at the end (call ``ctx.device_barrier(group)``
            before reading ``output`` or reusing the buffers).
        config: an :class:`iris.ccl.Config` (``block_size``).

    Example:
        >>> out = ctx.empty(ctx.get_num_ranks() * 128, 64)
        >>> ctx.ccl.all_gather(out, ctx.ones(128, 64))
    """
    config = _common.config_or_default(config)
    what = "all_gather"
    ctx.team.check_tensor(what, "input", input, _common.MOVE_DTYPES, symmetric=False)
    ctx.team.check_tensor(what, "output", output, _common.MOVE_DTYPES, symmetric=True)
    members = ctx.team.participants(group)
    if output.dtype != input.dtype or output.numel() != members.size * input.numel():
        raise ValueError(f"{what}: output must hold {members.size} x input ({members.size * input.numel()} "
                         f"{input.dtype} elements, shape ({members.size}*M, N)); got {tuple(output.shape)} "
                         f"{output.dtype} for input {tuple(input.shape)}")
    numel = input.numel()
    return _common.run(ctx, group, async_op, _common.fuse(config, input.nbytes), _all_gather_kernel,
                       triton.cdiv(numel, config.block_size), input, output, numel, members.tensor, members.size,
                       members.index, ctx.get_rank(), ctx.get_heap_bases(), BLOCK=config.block_size)
