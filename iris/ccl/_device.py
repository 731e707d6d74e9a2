"""Device helpers every collective kernel shares: the fused form's barriers.

A collective kernel runs either as many programs between two ``device_barrier`` launches, or
``FUSED``: one launch instead of three, for small messages. There each of its programs (at most
:data:`iris.device_barrier.FUSED_PROGRAMS`) enters a barrier with the programs of the same id on
the other members, does its share of the pieces, and leaves through that barrier again.

Why program-wise barriers suffice: program p of every member uses barrier slot p. Entering, it
waits until program p of every member has started, so every member's kernel has started and the
work before it on each stream is done. Leaving, it waits until program p of every member is
done with all of its reads and writes. Once every program of a member has left, every program of
every other member is done touching that member's memory. No program waits for another program
of its own launch, so the programs need not run at the same time. Every member must launch the
same number of programs.
"""

import triton
import triton.language as tl

from iris.device.sync import barrier_round


@triton.jit
def enter(arrivals, expected, members, count, cur, heap_bases, WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr):
    """This program's entry barrier (slot ``program_id``): every member's buffers are ready."""
    slot = tl.program_id(0) * WORLD  # the slots' counters lie one world's worth apart
    barrier_round(arrivals + slot, expected + slot, members, count, cur, heap_bases, BARRIER_BLOCK)
    tl.debug_barrier()  # the waiting lanes' acquire, before any thread of the program touches a peer


@triton.jit
def leave(arrivals, expected, members, count, cur, heap_bases, WORLD: tl.constexpr, EXIT_BARRIER: tl.constexpr,
          BARRIER_BLOCK: tl.constexpr):
    """This program's exit barrier (unless async): program ``program_id`` of every member is done."""
    if EXIT_BARRIER:
        slot = tl.program_id(0) * WORLD
        barrier_round(arrivals + slot, expected + slot, members, count, cur, heap_bases, BARRIER_BLOCK)
