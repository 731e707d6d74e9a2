"""The barrier every collective and fused-op kernel enters and leaves (device side).

Unfused, a kernel has one program per piece between two ``device_barrier`` launches and both barriers compile
out. ``FUSED`` (one launch instead of three, for small messages), program p of every member meets at barrier
slot p on entry and on exit. That suffices: entering, every member's kernel has started, so the work before it
on each stream is done; once all of a member's programs have left, no peer touches its memory. No program
waits on its own launch, so programs need not be co-resident; every member launches the same grid.

Example:
    >>> @triton.jit(do_not_specialize=GROUP_ARGS)
    ... def kernel(..., members, count, index, cur, heap_bases, arrivals, expected, pieces,
    ...            FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr,
    ...            TRACE: tl.constexpr):
    ...     trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    ...     for pid in range(tl.program_id(0), pieces, tl.num_programs(0)):
    ...         piece(pid, trace, ...)  # records its span: trace.start(tracing.PUT, ...) ... trace.end(span)
    ...     leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)
"""

import triton
import triton.language as tl

from iris.device.rma import HEAP_BASES_SLOT
from iris.device.sync import barrier_round
from iris.device.tracing import BARRIER, tracing_from_context

# Barrier slots; a fused kernel's program p uses slot p, so a fused launch has at most this many programs.
FUSED_PROGRAMS = 128

# Rank and group-size arguments, kept generic so one compilation serves every rank and group.
GROUP_ARGS = ("count", "index", "cur")


@triton.jit
def enter(arrivals, expected, members, count, cur, heap_bases, WORLD: tl.constexpr, ENTER_BARRIER: tl.constexpr,
          BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr):
    """Entry barrier of a fused launch; returns the program's tracing handle (records only with ``TRACE``)."""
    trace = tracing_from_context(heap_bases - HEAP_BASES_SLOT, WORLD, TRACE)
    if ENTER_BARRIER:
        slot = tl.program_id(0) * WORLD  # the slots' counters lie one world's worth apart
        span = trace.start(BARRIER, cur, cur, arrivals + slot, -1, -1, 0)
        barrier_round(arrivals + slot, expected + slot, members, count, cur, heap_bases, BARRIER_BLOCK)
        tl.debug_barrier()  # the waiting lanes' acquire, before any thread of the program touches a peer
        trace.end(span)
    return trace


@triton.jit
def leave(arrivals, expected, members, count, cur, heap_bases, WORLD: tl.constexpr, EXIT_BARRIER: tl.constexpr,
          BARRIER_BLOCK: tl.constexpr, trace):
    """This program's exit barrier (unless async): program ``program_id`` of every member is done."""
    if EXIT_BARRIER:
        slot = tl.program_id(0) * WORLD
        span = trace.start(BARRIER, cur, cur, arrivals + slot, -1, -1, 0)
        barrier_round(arrivals + slot, expected + slot, members, count, cur, heap_bases, BARRIER_BLOCK)
        trace.end(span)
