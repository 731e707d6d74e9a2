"""The Triton kernel that one_shot, two_shot (and its writes), atomic, spinlock and ring share.

One kernel with a VARIANT constexpr that picks the piece each program runs, inside the group's
barriers (:mod:`iris.device.barrier`); each variant's module launches it with :func:`launch`. The
kernel takes the lock words and ring flags and counts on every launch (the regions spinlock and ring
declare), so every variant compiles the same signature.

Example:
    >>> launch(ctx, out, x, ReduceOp.SUM, config, workspace, False, "one_shot", pieces=8, fuse=True)
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris.ccl import _common
from iris.ccl.all_gather import store_to_members
from iris.ccl.reduction import combine, reduce_block
from iris.device import atomics, rma, sync, tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes

# spinlock's lock words (int32) per rank: block b of an output is guarded by word b % LOCK_WORDS of its member
LOCK_WORDS = tl.constexpr(4096)


@triton.jit
def _one_shot_piece(pid, src, dst, numel, members, count, cur, heap_bases, OP: tl.constexpr, ACC: tl.constexpr,
                    BLOCK: tl.constexpr):
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = reduce_block(src, offs, mask, members, count, 0, cur, heap_bases, OP, ACC)
    tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _two_shot_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, OP: tl.constexpr,
                    ACC: tl.constexpr, BLOCK: tl.constexpr):
    # This member's slice: blocks index, index + count, ... of the flat tensor.
    offs = (tl.cast(pid, tl.int64) * count + index) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = reduce_block(src, offs, mask, members, count, index, cur, heap_bases, OP, ACC).to(dst.dtype.element_ty)
    store_to_members(dst + offs, acc, members, count, index, cur, heap_bases, mask, 0)


@triton.jit
def _write_half_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, BLOCK: tl.constexpr):
    """two_shot by writes (two members), first kernel: block ``pid`` of the other member's half of this member's
    input (its blocks other, other + 2, ...) into the other's output, where the other sums it with its own."""
    other = (index + 1) % count
    offs = (tl.cast(pid, tl.int64) * count + other) * BLOCK + tl.arange(0, BLOCK)
    rma.put(src + offs, dst + offs, cur, tl.load(members + other), heap_bases, mask=offs < numel)


@triton.jit
def _sum_written_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, OP: tl.constexpr,
                       ACC: tl.constexpr, BLOCK: tl.constexpr):
    """two_shot by writes, second kernel: block ``pid`` of this member's half, its own input combined with what
    the other wrote into its output (the order two_shot's reads take: its own first), into both outputs."""
    offs = (tl.cast(pid, tl.int64) * count + index) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = combine(tl.load(src + offs, mask=mask).to(ACC), tl.load(dst + offs, mask=mask).to(ACC), OP)
    store_to_members(dst + offs, acc.to(dst.dtype.element_ty), members, count, index, cur, heap_bases, mask, 0)


@triton.jit
def _seed_piece(pid, src, dst, numel, BLOCK: tl.constexpr):
    """atomic, spinlock: this member's own input is where its output starts."""
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _accumulate_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, locks, SPINLOCK: tl.constexpr,
                      OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """atomic, spinlock: combine this member's block into every other member's output."""
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(src + offs, mask=mask)
    for i in range(1, count):
        peer = tl.load(members + (index + i) % count)  # start at a different peer on every rank
        if SPINLOCK:
            lock = locks + tl.cast(pid, tl.int64) % LOCK_WORDS
            while atomics.atomic_cas(lock, 0, 1, cur, peer, heap_bases, sem="acquire", scope="sys") != 0:
                pass
            tl.debug_barrier()  # the acquire before any thread reads the block
            theirs = rma.load(dst + offs, cur, peer, heap_bases, mask=mask, volatile=True)
            combined = combine(theirs.to(ACC), x.to(ACC), OP).to(dst.dtype.element_ty)
            rma.store(dst + offs, combined, cur, peer, heap_bases, mask=mask)
            tl.debug_barrier()  # every thread's store before the release
            atomics.atomic_xchg(lock, 0, cur, peer, heap_bases, sem="release", scope="sys")
        elif OP == "sum":
            atomics.atomic_add(dst + offs, x, cur, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
        elif OP == "max":
            atomics.atomic_max(dst + offs, x, cur, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
        else:
            atomics.atomic_min(dst + offs, x, cur, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")


@triton.jit
def _ring_piece(pid, src, dst, numel, chunk, members, count, index, cur, heap_bases, flags, seen,
                OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """ring: block ``pid`` of every chunk through the reduce and gather steps; returns the flag count seen.

    Chunk c is elements [c * chunk, (c + 1) * chunk). After reduce step s a member holds chunk
    (index - s - 1) summed over s + 2 members; after the last, chunk (index + 1) is complete and
    the gather steps pass the complete chunks on. Each step stores into the right neighbour's
    output, then adds 1 to its flag (release); a member waits for its own flag (acquire) to
    count one more before it reads what its left neighbour stored. In a job across nodes (the engine
    path) each step's store is a block put from memory: the input at step 0, later this member's own
    copy of the chunk, stored back as read first (no member writes that chunk here again before this
    step has sent it: every later write of it comes around the ring after this member's signal).
    """
    right = tl.load(members + (index + 1) % count)
    within = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    flag = flags + tl.program_id(0)  # this program's counter, the same word on every member
    if count == 1:  # a group of one: no steps, the sum is the input
        tl.store(dst + within, tl.load(src + within, mask=within < numel), mask=within < numel)
    for step in range(0, 2 * count - 2):
        if step < count - 1:
            c = (index - step + count) % count  # reduce steps: the partial sum of chunk index - step
        else:
            c = (index + 1 - (step - (count - 1)) + 2 * count) % count  # gather steps: complete chunks
        offs = c * chunk + within
        mask = (within < chunk) & (offs < numel)
        if rma.ENGINE:  # toward another node a block put, from memory (see store_to_members)
            if step == 0:
                rma.put(src + offs, dst + offs, cur, right, heap_bases, mask=mask)
            else:  # stored back as read (volatile), so the put's own reads of it see those values
                tl.store(dst + offs, tl.load(dst + offs, mask=mask, volatile=True), mask=mask)
                rma.put(dst + offs, dst + offs, cur, right, heap_bases, mask=mask)
        else:
            if step == 0:
                out = tl.load(src + offs, mask=mask)
            else:
                out = tl.load(dst + offs, mask=mask, volatile=True)  # computed here, or stored by the left neighbour
            rma.store(dst + offs, out, cur, right, heap_bases, mask=mask)
        tl.debug_barrier()  # every thread's store before the flag
        sync.signal(flag, 1, cur, right, heap_bases, op="add")
        seen += 1
        sync.wait_until(flag, ">=", seen)
        tl.debug_barrier()  # the acquire before any thread reads what arrived
        if step < count - 1:  # arrived: chunk c - 1 summed over step + 1 members; add this member's part
            offs = ((c - 1 + count) % count) * chunk + within
            mask = (within < chunk) & (offs < numel)
            theirs = tl.load(dst + offs, mask=mask, volatile=True).to(ACC)
            mine = tl.load(src + offs, mask=mask).to(ACC)
            tl.store(dst + offs, combine(theirs, mine, OP).to(dst.dtype.element_ty), mask=mask)
    return seen


@triton.jit
def _all_reduce_piece(pid, trace, src, dst, numel, members, count, index, cur, heap_bases, locks,
                      VARIANT: tl.constexpr, OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    span = trace.start(tracing.REDUCE, cur, -1, src, pid, -1, elements_bytes(src, count * BLOCK))
    if VARIANT == "two_shot":
        _two_shot_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, OP, ACC, BLOCK)
    elif VARIANT == "one_shot":
        _one_shot_piece(pid, src, dst, numel, members, count, cur, heap_bases, OP, ACC, BLOCK)
    elif VARIANT == "write_halves":  # two_shot by writes (see all_reduce), first kernel
        _write_half_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, BLOCK)
    elif VARIANT == "sum_written":  # and second
        _sum_written_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, OP, ACC, BLOCK)
    elif (VARIANT == "atomic") or (VARIANT == "spinlock"):  # ring runs fused only: see _ring_piece
        _accumulate_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, locks,
                          VARIANT == "spinlock", OP, ACC, BLOCK)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS + ("chunk",))
def _all_reduce_kernel(src, dst, numel, chunk, members, count, index, cur, heap_bases, locks, flags, counts, arrivals,
                       expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                       BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, VARIANT: tl.constexpr, OP: tl.constexpr,
                       ACC: tl.constexpr, BLOCK: tl.constexpr):
    if (VARIANT == "atomic") or (VARIANT == "spinlock"):  # fused only: seed the output, then enter
        for pid in range(tl.program_id(0), programs, tl.num_programs(0)):
            _seed_piece(pid, src, dst, numel, BLOCK)
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    if VARIANT == "ring":  # fused only
        seen = tl.load(counts + tl.program_id(0))  # this program's flag count before this call
        for pid in range(tl.program_id(0), programs, tl.num_programs(0)):
            span = trace.start(tracing.REDUCE, cur, -1, dst, pid, -1, elements_bytes(dst, count * BLOCK))
            seen = _ring_piece(pid, src, dst, numel, chunk, members, count, index, cur, heap_bases, flags, seen,
                               OP, ACC, BLOCK)
            trace.end(span)
        tl.store(counts + tl.program_id(0), seen)
    else:
        for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
            _all_reduce_piece(pid, trace, src, dst, numel, members, count, index, cur, heap_bases, locks, VARIANT,
                              OP, ACC, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def accumulator(dtype):
    """The type a variant sums ``dtype`` in: float32 for floats, int32 for int32."""
    return tl.float32 if dtype.is_floating_point else tl.int32


def launch(ctx, output, input, op, config, workspace, async_op: bool, variant: str, pieces: int,
           fuse: bool) -> list:
    """Launch the kernel as ``variant`` over ``pieces`` pieces of work (:func:`iris.ccl._common.run`: one fused
    launch, or barrier, kernel and, unless ``async_op``, barrier); returns the launches, bound."""
    members, team = workspace.members, ctx.team
    return _common.run(ctx, workspace.group, async_op, fuse, _all_reduce_kernel, pieces, input, output, input.numel(),
                       triton.cdiv(input.numel(), members.size), members.tensor, members.size, members.index,
                       ctx.get_rank(), ctx.get_heap_bases(), team.region("ccl.locks"), team.region("ccl.ring_flags"),
                       team.region("ccl.ring_counts"), VARIANT=variant, OP=op.value, ACC=accumulator(input.dtype),
                       BLOCK=config.block_size)
