"""Atomic read-modify-write on any rank's heap, from a Triton kernel.

Each op acts from the current rank (``from_rank``) on ``to_rank``'s memory and returns the old values, like
``tl.atomic_*``; operands are converted to the word's dtype. ``sem`` and ``scope`` go to Triton (None: acq_rel,
gpu); a word another GPU observes needs ``scope="sys"`` with release/acquire.

Example:
    >>> old = iris.atomic_add(counter, 1, cur_rank, peer, heap_bases, sem="release", scope="sys")
"""

import triton
import triton.language as tl

from iris.device.rma import as_element, cas_target, far_update, near_lanes, translate


@triton.jit
def _near_atomic(OP: tl.constexpr, target, word, near, sem, scope):
    """Triton's atomic ``OP`` on the pointer path (float min and float exchange as integer atomics)."""
    element: tl.constexpr = word.dtype
    if OP == "add":
        old = tl.atomic_add(target, word, mask=near, sem=sem, scope=scope)
    elif OP == "and":
        old = tl.atomic_and(target, word, mask=near, sem=sem, scope=scope)
    elif OP == "or":
        old = tl.atomic_or(target, word, mask=near, sem=sem, scope=scope)
    elif OP == "xor":
        old = tl.atomic_xor(target, word, mask=near, sem=sem, scope=scope)
    elif OP == "max":
        old = tl.atomic_max(target, word, mask=near, sem=sem, scope=scope)
    elif (OP == "min") and (element == tl.float32):
        old = _float_min(target, word, tl.int32, tl.uint32, near, sem, scope)
    elif (OP == "min") and (element == tl.float64):
        old = _float_min(target, word, tl.int64, tl.uint64, near, sem, scope)
    elif OP == "min":
        old = tl.atomic_min(target, word, mask=near, sem=sem, scope=scope)
    elif element == tl.float32:  # "xchg" of a float: its bits (Triton's interpreter has no float exchange)
        old = tl.atomic_xchg(target.to(tl.pointer_type(tl.int32)), word.to(tl.int32, bitcast=True), mask=near,
                             sem=sem, scope=scope).to(element, bitcast=True)
    elif element == tl.float64:
        old = tl.atomic_xchg(target.to(tl.pointer_type(tl.int64)), word.to(tl.int64, bitcast=True), mask=near,
                             sem=sem, scope=scope).to(element, bitcast=True)
    else:  # "xchg"
        old = tl.atomic_xchg(target, word, mask=near, sem=sem, scope=scope)
    return old


@triton.jit
def _update(OP: tl.constexpr, pointer, word, from_rank, to_rank, heap_bases, mask, sem, scope):
    """``OP`` of ``word`` on ``to_rank``'s ``pointer``: Triton's atomic in the node, the engine's beyond it."""
    near = near_lanes(to_rank, heap_bases, mask)
    old = _near_atomic(OP, translate(pointer, from_rank, to_rank, heap_bases, near), word, near, sem, scope)
    return far_update(OP, old, pointer, word, from_rank, to_rank, heap_bases, mask, sem)


@triton.jit
def atomic_add(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None):
    """Atomically add ``val`` to ``to_rank``'s ``pointer``; returns the old values."""
    return _update("add", pointer, as_element(val, pointer), from_rank, to_rank, heap_bases, mask, sem, scope)


@triton.jit
def atomic_sub(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None):
    """Atomically subtract ``val`` from ``to_rank``'s ``pointer``; returns the old values."""
    return _update("add", pointer, -as_element(val, pointer), from_rank, to_rank, heap_bases, mask, sem, scope)


@triton.jit
def atomic_cas(pointer, cmp, val, from_rank, to_rank, heap_bases, sem=None, scope=None):
    """Where ``to_rank``'s ``pointer`` equals ``cmp``, store ``val``; returns the old values.

    Float words compare bit for bit (-0.0 is not 0.0), as integers: Triton 3.6 cannot compile a float
    compare-and-swap for AMD.
    """
    # Unlike the other atomics, Triton's compare-and-swap does not broadcast its operands.
    cmp = as_element(cmp, pointer)
    val = as_element(val, pointer)
    if pointer.type.is_block():
        cmp = tl.broadcast_to(cmp, pointer.shape)
        val = tl.broadcast_to(val, pointer.shape)
    target = cas_target(pointer, from_rank, to_rank, heap_bases)
    if pointer.dtype.element_ty == tl.float32:
        old = _bitwise_cas(target, cmp, val, tl.int32, sem, scope)
    elif pointer.dtype.element_ty == tl.float64:
        old = _bitwise_cas(target, cmp, val, tl.int64, sem, scope)
    else:
        old = tl.atomic_cas(target, cmp, val, sem=sem, scope=scope)
    return far_update("cas", old, pointer, (cmp, val), from_rank, to_rank, heap_bases, None, sem)


@triton.jit
def _bitwise_cas(target, cmp, val, INT: tl.constexpr, sem, scope):
    """Compare-and-swap of float words as integers of the same width (see atomic_cas)."""
    bits = tl.atomic_cas(target.to(tl.pointer_type(INT)), cmp.to(INT, bitcast=True), val.to(INT, bitcast=True),
                         sem=sem, scope=scope)
    return bits.to(val.dtype, bitcast=True)


@triton.jit
def atomic_xchg(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None):
    """Atomically replace ``to_rank``'s ``pointer`` with ``val``; returns the old values."""
    return _update("xchg", pointer, as_element(val, pointer), from_rank, to_rank, heap_bases, mask, sem, scope)


@triton.jit
def atomic_xor(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None):
    """Atomic bitwise xor on ``to_rank``'s ``pointer``; returns the old values."""
    return _update("xor", pointer, as_element(val, pointer), from_rank, to_rank, heap_bases, mask, sem, scope)


@triton.jit
def atomic_and(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None):
    """Atomic bitwise and on ``to_rank``'s ``pointer``; returns the old values."""
    return _update("and", pointer, as_element(val, pointer), from_rank, to_rank, heap_bases, mask, sem, scope)


@triton.jit
def atomic_or(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None):
    """Atomic bitwise or on ``to_rank``'s ``pointer``; returns the old values."""
    return _update("or", pointer, as_element(val, pointer), from_rank, to_rank, heap_bases, mask, sem, scope)


@triton.jit
def _float_min(target, val, INT: tl.constexpr, UINT: tl.constexpr, mask, sem, scope):
    """Float minimum as two integer atomics (signed min where the sign is clear, unsigned max where set).

    Spelled out as Triton lowers it because Triton 3.6/3.7's interpreter returns wrong old values."""
    if target.type.is_block():  # both halves' masks must be blocks
        val = tl.broadcast_to(val, target.shape)
    bits = val.to(INT, bitcast=True)
    negative = bits < 0
    if mask is None:
        lower, upper = negative == 0, negative
    else:
        lower, upper = mask & (negative == 0), mask & negative
    low_old = tl.atomic_min(target.to(tl.pointer_type(INT)), bits, mask=lower, sem=sem, scope=scope)
    high_old = tl.atomic_max(target.to(tl.pointer_type(UINT)), bits.to(UINT, bitcast=True), mask=upper, sem=sem,
                             scope=scope)
    return tl.where(negative, high_old.to(val.dtype, bitcast=True), low_old.to(val.dtype, bitcast=True))


@triton.jit
def atomic_min(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None):
    """Atomic minimum on ``to_rank``'s ``pointer``; returns the old values."""
    return _update("min", pointer, as_element(val, pointer), from_rank, to_rank, heap_bases, mask, sem, scope)


@triton.jit
def atomic_max(pointer, val, from_rank, to_rank, heap_bases, mask=None, sem=None, scope=None):
    """Atomic maximum on ``to_rank``'s ``pointer``; returns the old values."""
    return _update("max", pointer, as_element(val, pointer), from_rank, to_rank, heap_bases, mask, sem, scope)
