"""The device-side reductions every reducing collective shares (all_reduce's variants, reduce_scatter).

``combine`` applies the op to two blocks; ``reduce_block`` reduces one block of a symmetric tensor
over a group's members, reading each member's copy through the heap.

Example (inside a ``@triton.jit`` kernel):
    >>> acc = reduce_block(src, offs, mask, members, count, 0, cur, heap_bases, "sum", tl.float32)
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris.device import rma


@triton.jit
def combine(acc, x, OP: tl.constexpr):
    """``acc`` OP ``x`` elementwise, OP one of "sum", "max", "min" (compile-time)."""
    if OP == "sum":
        out = acc + x
    elif OP == "max":
        out = tl.maximum(acc, x)
    else:
        out = tl.minimum(acc, x)
    return out


@triton.jit
def reduce_block(src, offs, mask, members, count, first, cur, heap_bases, OP: tl.constexpr, ACC: tl.constexpr,
                 cache_modifier=None):
    """The reduction of ``src + offs`` over every member, in member order from position ``first`` on.

    Where one member alone reduces a block (two_shot, reduce_scatter) it starts at its own
    position: the readers then start on different members, where all starting on member 0 would
    queue every reader on one member's links at a time. Where every member reduces the block
    itself (one_shot) they all pass 0, so every member gets the same bits. ``cache_modifier``: Triton's, for
    the loads (None or "": the default).
    """
    acc = rma.load(src + offs, cur, tl.load(members + first), heap_bases, mask=mask,
                   cache_modifier=cache_modifier).to(ACC)
    for i in range(1, count):
        x = rma.load(src + offs, cur, tl.load(members + (first + i) % count), heap_bases, mask=mask,
                     cache_modifier=cache_modifier).to(ACC)
        acc = combine(acc, x, OP)
    return acc
