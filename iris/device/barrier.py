"""The fused barrier every collective and fused-op kernel shares (device side).

A collective kernel runs either as many programs between two ``device_barrier`` launches, or
``FUSED``: one launch instead of three, for small messages. There each of its programs (at most
:data:`FUSED_PROGRAMS`) enters a barrier with the programs of the same id on
the other members, does its share of the pieces, and leaves through that barrier again.

Why program-wise barriers suffice: program p of every member uses barrier slot p. Entering, it
waits until program p of every member has started, so every member's kernel has started and the
work before it on each stream is done. Leaving, it waits until program p of every member is
done with all of its reads and writes. Once every program of a member has left, every program of
every other member is done touching that member's memory. No program waits for another program
of its own launch, so the programs need not run at the same time. Every member must launch the
same number of programs.

Every collective's kernel has the one skeleton below, fused or not (``iris.ccl._common.run``
launches it): unfused, the grid has one program per piece, so the loop runs once and both
barriers are compiled out; fused, at most FUSED_PROGRAMS programs share the pieces between the
barriers.

Example:
    >>> @triton.jit(do_not_specialize=GROUP_ARGS)
    ... def kernel(..., members, count, index, cur, heap_bases, arrivals, expected, pieces,
    ...            FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr,
    ...            TRACE: tl.constexpr):
    ...     trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    ...     for pid in range(tl.program_id(0), pieces, tl.num_programs(0)):
    ...         piece(pid, trace, ...)  # records its span: trace.start(tracing.PUT, ...) ... trace.end(span)
    ...     leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)

``enter`` returns the program's tracing handle (:mod:`iris.device.tracing`, from the context tensor
``heap_bases`` lies in): built with ``TRACE``, it records each barrier round as a "barrier" span
and the pieces record theirs; built without, it records nothing and compiles to nothing.
"""

import triton
import triton.language as tl

from iris.device.rma import HEAP_BASES_SLOT
from iris.device.sync import barrier_round
from iris.device.tracing import BARRIER, tracing_from_context

# Barrier slots: slot 0 is device_barrier's own; a fused kernel's program p uses slot p, so a fused
# launch has at most this many programs.
FUSED_PROGRAMS = 128

# Kernel arguments that name ranks or the group's size: kept generic, so one compilation serves every
# rank and group (Triton would otherwise specialize on a value of 1). Use as
# ``@triton.jit(do_not_specialize=GROUP_ARGS)``.
GROUP_ARGS = ("count", "index", "cur")


@triton.jit
def enter(arrivals, expected, members, count, cur, heap_bases, WORLD: tl.constexpr, ENTER_BARRIER: tl.constexpr,
          BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr):
    """This program's entry barrier (slot ``program_id``), when ``ENTER_BARRIER`` (a fused launch):
    every member's buffers are ready. Returns the program's tracing handle (records only with ``TRACE``)."""
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
