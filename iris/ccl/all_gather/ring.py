"""all_gather's "ring" variant: each member stores its block into its right neighbour's output only; each block
then travels the ring, forwarded one step at a time after a flag on the heap says it arrived.

W - 1 steps, one link each; always one launch (a program waits only on the same program of its left
neighbour). Its flags, one int32 per piece of every member's block, are a heap workspace
(:class:`AllGatherWorkspace`) that every call leaves at 0.

Example:
    >>> ctx.ccl.all_gather(out, x, config=Config(all_gather_variant="ring"))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from iris.ccl import _common
from iris.device import rma, sync, tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes


@triton.jit
def _forward(slot, data, cur, peer, heap_bases, mask, FROM_MEMORY: tl.constexpr, CACHE: tl.constexpr):
    """Store ``data``, which this member holds at ``slot``, at ``slot`` on ``peer``. In a job across nodes (the
    engine path) a block put from memory (``FROM_MEMORY``: stored back as read first, so that the put's own
    reads see what a neighbour stored there), as in :func:`store_to_members`."""
    if rma.ENGINE:
        if FROM_MEMORY:
            tl.store(slot, data, mask=mask)
        rma.put(slot, slot, cur, peer, heap_bases, mask=mask)
    else:
        rma.store(slot, data, cur, peer, heap_bases, mask=mask, cache_modifier=CACHE)


@triton.jit
def _ring_piece(pid, trace, src, dst, numel, pieces, flags, members, count, index, cur, heap_bases,
                CACHE: tl.constexpr, BLOCK: tl.constexpr):
    """Piece ``pid`` of every member's block around the ring. Step 0: this member's piece into its own and its
    right neighbour's output. Step s: member index - s's piece arrived (its flag, slot x pieces + pid, is 1);
    the flag is reset for the next call and, but at the last step, the piece forwarded and flagged."""
    span = trace.start(tracing.PUT, cur, -1, dst, pid, -1, elements_bytes(dst, count * BLOCK))
    right = tl.load(members + (index + 1) % count)
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    data = tl.load(src + offs, mask=mask)
    mine = dst + tl.cast(index, tl.int64) * numel + offs
    tl.store(mine, data, mask=mask)
    if count > 1:
        _forward(mine, data, cur, right, heap_bases, mask, False, CACHE)
        tl.debug_barrier()  # every thread's store before the flag
        sync.signal(flags + tl.cast(index, tl.int64) * pieces + pid, 1, cur, right, heap_bases)
    for step in range(1, count):
        slot = (index + count - step) % count
        flag = flags + tl.cast(slot, tl.int64) * pieces + pid
        sync.wait_until(flag, "==", 1)
        tl.debug_barrier()  # the acquire before any thread reads what arrived
        tl.atomic_xchg(flag, 0, sem="relaxed", scope="sys")  # the next call's: its barriers order it
        if step < count - 1:
            at = dst + tl.cast(slot, tl.int64) * numel + offs
            _forward(at, tl.load(at, mask=mask, volatile=True), cur, right, heap_bases, mask, True, CACHE)
            tl.debug_barrier()  # every thread's store before the flag
            sync.signal(flag, 1, cur, right, heap_bases)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_gather_ring_kernel(src, dst, numel, pieces, flags, members, count, index, cur, heap_bases, arrivals,
                            expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr,
                            WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr,
                            CACHE: tl.constexpr, BLOCK: tl.constexpr):
    """The ring all_gather of ``numel`` elements per member (``pieces`` pieces of BLOCK), always fused: a
    program waits only on the same program of its left neighbour, and every member runs the same grid."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
        _ring_piece(pid, trace, src, dst, numel, pieces, flags, members, count, index, cur, heap_bases, CACHE,
                    BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


@dataclass(eq=False)  # compared (and hashed) by identity: ctx.ccl remembers calls by their workspace
class AllGatherWorkspace:
    """What the "ring" all_gather keeps between calls: ``flags``, one int32 per piece of every member's block,
    on the heap, left at 0 by every call; ``variant``, ``shape``, ``dtype`` and ``prepared`` as the preamble
    set them (:func:`iris.ccl.all_gather.all_gather_preamble`). Other variants need nothing.

    Example:
        >>> workspace = ctx.ccl.all_gather_preamble(out, x, config=Config(all_gather_variant="ring"))
        >>> ctx.ccl.all_gather(out, x, config=Config(all_gather_variant="ring"), workspace=workspace)
    """

    variant: str = ""
    shape: tuple = ()
    dtype: torch.dtype | None = None
    flags: torch.Tensor | None = None
    prepared: bool = False


def flags_needed(members: int, numel: int, config) -> int:
    """The flags of a ring of ``members`` gathering ``numel`` elements each: one per piece of every block."""
    return members * triton.cdiv(numel, config.block_size)


def launch(ctx, output, input, members, group, async_op: bool, config, cache: str, flags) -> list:
    """The ring all_gather of checked tensors with ``flags`` (None: a heap workspace the context keeps for the
    size); returns the bound launches."""
    if flags is None:
        need = flags_needed(members.size, input.numel(), config)
        flags = ctx.ccl.kept_workspace(("all_gather ring", need), lambda: ctx.zeros(need, dtype=torch.int32))
    pieces = triton.cdiv(input.numel(), config.block_size)
    return _common.run(ctx, group, async_op, True, _all_gather_ring_kernel, pieces, input, output, input.numel(),
                       pieces, flags, members.tensor, members.size, members.index, ctx.get_rank(),
                       ctx.get_heap_bases(), CACHE=cache, BLOCK=config.block_size)
