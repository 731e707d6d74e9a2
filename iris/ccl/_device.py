"""Device helpers every collective kernel shares: the fused form's barriers.

A collective kernel runs either as many programs between two ``device_barrier`` launches, or
``FUSED``: one program that enters the group's barrier, does every piece of work in a loop, and
leaves through the barrier again: one launch instead of three, for small messages.
"""

import triton
import triton.language as tl

from iris.device.sync import barrier_round


@triton.jit
def enter(arrivals, expected, members, count, cur, heap_bases, BARRIER_BLOCK: tl.constexpr):
    """The group's entry barrier inside the kernel: every member's buffers are ready."""
    barrier_round(arrivals, expected, members, count, cur, heap_bases, BARRIER_BLOCK)
    tl.debug_barrier()  # the waiting lanes' acquire, before any thread of the program touches a peer


@triton.jit
def leave(arrivals, expected, members, count, cur, heap_bases, EXIT_BARRIER: tl.constexpr,
          BARRIER_BLOCK: tl.constexpr):
    """The exit barrier (unless async): every member's writes have landed, nobody reads an input any more."""
    if EXIT_BARRIER:
        barrier_round(arrivals, expected, members, count, cur, heap_bases, BARRIER_BLOCK)
