"""Small kernels shared by several test modules (imported by rank processes too)."""

import triton
import triton.language as tl

import iris


@triton.jit
def write_slot_kernel(slots, value, rank, peer, heap_bases):
    iris.store(slots + rank, value, rank, peer, heap_bases)


@triton.jit
def put_block_kernel(src, dst, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    iris.put(src + offs, dst + offs, rank, peer, heap_bases, mask=offs < n)
