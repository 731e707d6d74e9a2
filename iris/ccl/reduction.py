"""The device-side reductions the reducing collectives share: ``combine`` applies the op to two blocks,
``reduce_block`` reduces a block of a symmetric tensor over a group's members through the heap.

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
    """The reduction of ``src + offs`` over every member, in member order from position ``first`` on: a member
    reducing a block alone starts at its own (the readers then spread over the members' links), members all
    reducing it pass 0 (the same bits everywhere). ``cache_modifier``: the loads' (None or "": the default)."""
    acc = rma.load(src + offs, cur, tl.load(members + first), heap_bases, mask=mask,
                   cache_modifier=cache_modifier).to(ACC)
    for i in range(1, count):
        x = rma.load(src + offs, cur, tl.load(members + (first + i) % count), heap_bases, mask=mask,
                     cache_modifier=cache_modifier).to(ACC)
        acc = combine(acc, x, OP)
    return acc
