"""Small kernels shared by several test modules (imported by rank processes too)."""

import triton

import iris


@triton.jit
def write_slot_kernel(slots, value, rank, peer, heap_bases):
    iris.store(slots + rank, value, rank, peer, heap_bases)
