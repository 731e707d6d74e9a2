"""Remote memory access from Triton kernels: translate, load, store, get, put, copy.

Rank arguments name the direction the data flows, from ``from_rank`` to
``to_rank``; the *current* rank is the one where the pointer is local:

| function | current rank    | what moves                                             |
|----------|-----------------|--------------------------------------------------------|
| load     | either rank (*) | the other rank's memory -> the returned block          |
| store    | ``from_rank``   | ``value`` -> ``to_rank``'s memory                      |
| get      | either rank (*) | the other rank's ``from_ptr`` -> local ``to_ptr``      |
| put      | ``from_rank``   | local ``from_ptr`` -> ``to_rank``'s ``to_ptr``         |
| copy     | ``cur_rank``    | ``from_rank``'s ``src_ptr`` -> ``to_rank``'s ``dst_ptr`` |

``heap_bases`` is ``ctx.get_heap_bases()``. When both ranks are the same the
access is an ordinary local one.

(*) Code names the two ranks of a read in both orders: one of them must be the current rank
(found by :func:`current_rank`), and the other is read. docs/programming-model.md has every op's
convention.
"""

import triton
import triton.language as tl

from iris.device import nvshmem as engine
from iris.runtime import device_facts

# The inline assembly kernels carry here (iris.runtime.device_facts: a cross-compile worker's is its target's).
# Neither: Triton's interpreter runs the kernels as Python, and device code takes its host path.
PTX = tl.constexpr(device_facts().inline_asm == "ptx")
AMDGCN = tl.constexpr(device_facts().inline_asm == "amdgcn")

# The host checks that every heap base is a multiple of this many bytes.
_CHUNK_BYTES = tl.constexpr(16)

# The context tensor (ctx.get_device_context(), int64): [RANK_SLOT] current rank, [WORLD_SLOT] world
# size, [HEAP_BASES_SLOT + r] heap base of rank r. ctx.get_heap_bases() is a view of its bases, so
# every device op finds the current rank just before the bases (see current_rank).
RANK_SLOT = tl.constexpr(0)
WORLD_SLOT = tl.constexpr(1)
HEAP_BASES_SLOT = tl.constexpr(2)

# The path toward ranks on another node (iris.device.nvshmem), compiled in by the shmem heap of a job that
# spans nodes (before any kernel compiles). Off, no device op carries a trace of it.
ENGINE = tl.constexpr(False)

# Debug mode (iris.host.debug.enable, from IRIS_DEBUG=1 or iris.iris(debug=True)): translate checks its
# ranks and pointers, and waits are bounded. Compile-time constants: without debug nothing is added.
# Compiled in, the checks of a context run only while its debug word is set (ctx.set_debug): the
# context tensor's last word, CHECKS_AFTER_BASES slots after the bases (past the tracing fields).
DEBUG = tl.constexpr(False)
CHECKS_AFTER_BASES = tl.constexpr(17)  # iris.device.tracing's HEADER + len(FIELDS)
RECORD_ADDRESS = tl.constexpr(0)  # the int64 debug record, layout in iris/host/debug.py
RANK_OUT_OF_RANGE_RECORD = tl.constexpr(3)
OUTSIDE_HEAP_RECORD = tl.constexpr(4)
NOT_THE_CURRENT_RANK_RECORD = tl.constexpr(5)


@triton.jit
def current_rank(heap_bases):
    """The rank this kernel runs on, read from the context tensor that ``heap_bases`` lies in
    (``ctx.get_heap_bases()`` and ``DeviceContext``'s bases both do).

    Example:
        >>> cur = iris.current_rank(heap_bases)
    """
    return tl.load(heap_bases + (RANK_SLOT - HEAP_BASES_SLOT))


@triton.jit
def checks_on(heap_bases):
    """Whether the context whose bases these are is in debug mode now (its debug word; see DEBUG)."""
    world = tl.load(heap_bases + (WORLD_SLOT - HEAP_BASES_SLOT))
    return tl.load(heap_bases + world + CHECKS_AFTER_BASES) != 0


@triton.jit
def debug_report(kind, address, expected, seen, detail, waited_ns):
    """Fill the debug record (the first report of a launch wins) for the host to raise from."""
    record = tl.full([], RECORD_ADDRESS, tl.int64).to(tl.pointer_type(tl.int64))
    if tl.atomic_cas(record, tl.full([], 0, tl.int64), tl.full([], kind, tl.int64)) == 0:
        tl.store(record + 1, tl.cast(tl.program_id(0), tl.int64))
        tl.store(record + 2, tl.cast(address, tl.int64))
        tl.store(record + 3, tl.cast(expected, tl.int64))
        tl.store(record + 4, tl.cast(seen, tl.int64))
        tl.store(record + 5, tl.cast(detail, tl.int64))
        tl.store(record + 6, tl.cast(waited_ns, tl.int64))


@triton.jit
def _checked_translate(ptr, from_rank, to_rank, heap_bases, mask):
    """Debug mode's translate: a lane with a rank outside the world or a pointer outside the heap
    (not masked off, in a context in debug mode) is reported in the record and redirected to its
    scratch word, so the access that follows cannot fault before the host reads the report."""
    record = tl.full([], RECORD_ADDRESS, tl.int64).to(tl.pointer_type(tl.int64))
    world = tl.load(heap_bases + (WORLD_SLOT - HEAP_BASES_SLOT))
    heap_bytes = tl.load(record + 9)
    rank_ok = (from_rank >= 0) & (from_rank < world) & (to_rank >= 0) & (to_rank < world)
    from_base = tl.load(heap_bases + tl.where(rank_ok, from_rank, 0))
    to_base = tl.load(heap_bases + tl.where(rank_ok, to_rank, 0))
    address = ptr.to(tl.int64)
    offset = address - from_base
    # A context out of debug mode (ctx.set_debug(False)) passes every lane: no branch on it, since the
    # AMD compiler rejects an if that yields a block of pointers.
    ok = (rank_ok & (offset >= 0) & (offset < heap_bytes)) | (checks_on(heap_bases) == 0)
    if mask is not None:
        ok = ok | (mask == 0)  # a masked-off lane is never accessed
    bad = (ok == 0) | tl.zeros([1], tl.int1)  # at least one dimension, for the reductions
    if tl.max(bad.to(tl.int32)) > 0:
        # Report the lane with the lowest bad address; ranks may be blocks too (one per lane).
        first = tl.min(tl.where(bad, address, 0x7FFFFFFFFFFFFFFF))
        lane = bad & (address == first)
        lane_from = tl.min(tl.where(lane, tl.cast(from_rank, tl.int64), 0x7FFFFFFFFFFFFFFF))
        lane_to = tl.min(tl.where(lane, tl.cast(to_rank, tl.int64), 0x7FFFFFFFFFFFFFFF))
        lane_rank_ok = (lane_from >= 0) & (lane_from < world) & (lane_to >= 0) & (lane_to < world)
        kind = tl.where(lane_rank_ok, OUTSIDE_HEAP_RECORD, RANK_OUT_OF_RANGE_RECORD)
        debug_report(kind, first, lane_from, lane_to, world, 0)
    # Select between integers, then make the pointer: the AMD compiler rejects a select between a
    # block of pointers and a scalar one (its addptr verifier; the interpreter and PTX accept it).
    moved = tl.where(ok, address + (to_base - from_base), RECORD_ADDRESS + 56)
    return moved.to(tl.pointer_type(ptr.dtype.element_ty))


@triton.jit
def translate(ptr, from_rank, to_rank, heap_bases, mask=None):
    """Translate ``ptr`` from ``from_rank``'s address space into ``to_rank``'s.

    Args:
        ptr: pointer or block of pointers into the symmetric heap, valid on ``from_rank``.
        from_rank: rank whose address space ``ptr`` is in.
        to_rank: rank whose address space the result is in.
        heap_bases: pointer to the int64 heap bases of all ranks.
        mask: the lanes that will be accessed (None: all). Only debug mode looks at it: it
            reports a rank out of range or a pointer outside the heap in a selected lane
            (iris.DeviceAccessError on the host) instead of letting the access fault.

    Returns:
        The same object's address on ``to_rank``, with ``ptr``'s type.

    Example:
        >>> remote = iris.translate(buf + offs, rank, peer, heap_bases)
    """
    if DEBUG:
        result = _checked_translate(ptr, from_rank, to_rank, heap_bases, mask)
    else:
        from_base = tl.load(heap_bases + from_rank)
        to_base = tl.load(heap_bases + to_rank)
        # Moving the typed pointer by a whole number of 16-byte chunks (instead of
        # casting through integers) keeps the compiler's knowledge of contiguity and
        # alignment, so remote accesses stay vectorized.
        elem_bytes: tl.constexpr = (ptr.dtype.element_ty.primitive_bitwidth + 7) // 8
        chunks = (to_base - from_base) // _CHUNK_BYTES
        result = ptr + chunks * (_CHUNK_BYTES // elem_bytes)
    return result


@triton.jit
def as_element(value, pointer):
    """``value`` (a Python number, a constexpr, or a scalar or block of any dtype) in ``pointer``'s element type.

    Every device op that takes a value, compare operand or signal value converts it here, so
    ``1 << 33`` means the same 8 bytes on an int64 word on every target and every supported
    Triton: the GPU compilers reject an atomic whose operand type differs from the word's, and
    some Triton interpreters compare or store only the operand's own width.
    """
    return tl.cast(value, pointer.dtype.element_ty)


@triton.jit
def _load(ptr, mask, other, cache_modifier, volatile):
    if cache_modifier is None:
        result = tl.load(ptr, mask=mask, other=other, volatile=volatile)
    else:
        result = tl.load(ptr, mask=mask, other=other, cache_modifier=cache_modifier, volatile=volatile)
    return result


@triton.jit
def _store(ptr, value, mask, cache_modifier):
    if cache_modifier is None:
        tl.store(ptr, value, mask=mask)
    else:
        tl.store(ptr, value, mask=mask, cache_modifier=cache_modifier)


@triton.jit
def near_lanes(rank, heap_bases, mask):
    """The lanes of ``mask`` (None: all) toward ``rank`` that take the pointer path: all of them, unless
    the engine path is compiled in (ENGINE) and ``rank`` is on another node."""
    if ENGINE:
        result = engine.near_mask(mask, engine.far(rank, heap_bases))
    else:
        result = mask
    return result


@triton.jit
def far_update(op: tl.constexpr, near_old, pointer, val, cur, rank, heap_bases, mask, sem: tl.constexpr):
    """``near_old`` (an atomic's old values on the pointer path) with the lanes of ``mask`` toward a rank
    on another node updated through the engine (``op`` and ``val`` as iris.device.nvshmem.update, "cas"
    included); only with ENGINE."""
    if ENGINE:
        result = engine.update(op, near_old, pointer, val, rank, cur, heap_bases,
                               engine.and_mask(mask, engine.far(rank, heap_bases)), sem)
    else:
        result = near_old
    return result


@triton.jit
def cas_target(pointer, cur, rank, heap_bases):
    """Where a compare-and-swap (which takes no mask) toward ``rank`` acts on the pointer path: ``pointer``
    translated, or, toward a rank on another node (with ENGINE), the engine's scratch word here."""
    target = translate(pointer, cur, rank, heap_bases)
    if ENGINE:
        target = tl.where(engine.far(rank, heap_bases), engine.scratch_pointer(pointer, heap_bases), target)
    return target


@triton.jit
def _read(pointer, cur, peer, heap_bases, mask, other, cache_modifier, volatile):
    """``peer``'s memory at ``pointer`` (local to ``cur``): a load, or the engine's reads toward another node."""
    near = near_lanes(peer, heap_bases, mask)
    result = _load(translate(pointer, cur, peer, heap_bases, near), near, other, cache_modifier, volatile)
    if ENGINE:
        result = engine.read(result, pointer, peer, cur, heap_bases, engine.far(peer, heap_bases), mask)
    return result


@triton.jit
def _write(pointer, value, cur, to_rank, heap_bases, mask, cache_modifier):
    """Store ``value`` into ``to_rank``'s ``pointer`` (local to ``cur``), through the engine toward another node."""
    near = near_lanes(to_rank, heap_bases, mask)
    _store(translate(pointer, cur, to_rank, heap_bases, near), value, near, cache_modifier)
    if ENGINE:
        engine.put_values(pointer, value, to_rank, cur, heap_bases,
                          engine.and_mask(mask, engine.far(to_rank, heap_bases)))


@triton.jit
def _peer_of(rank_a, rank_b, heap_bases):
    """(current rank, the other one) of two ranks of which one is the current rank: the order in which a
    read names them does not matter. In debug mode, two ranks that are both not the current rank are reported."""
    cur = current_rank(heap_bases)
    if DEBUG:
        wrong = ((cur != rank_a) & (cur != rank_b)) | tl.zeros([1], tl.int1)  # ranks may be blocks or constexprs
        if (tl.max(wrong.to(tl.int32)) > 0) & checks_on(heap_bases):
            first = tl.min(tl.where(wrong, rank_a, 0x7FFFFFFF))
            second = tl.min(tl.where(wrong, rank_b, 0x7FFFFFFF))
            debug_report(NOT_THE_CURRENT_RANK_RECORD, 0, first, second, cur, 0)
    return cur, tl.where(cur == rank_a, rank_b, rank_a)  # cur first: a constexpr rank compares as a tensor


@triton.jit
def load(pointer, to_rank, from_rank, heap_bases, mask=None, other=None, cache_modifier=None, volatile=False):
    """Read ``from_rank``'s memory at ``pointer`` into the current rank (``to_rank``).

    The two ranks may come in either order: one of them is the current rank (the pointer is local
    to it), the other is read.

    Args:
        pointer: block of pointers, local to the current rank.
        to_rank: the current rank (or the rank read, with ``from_rank`` the current one).
        from_rank: the rank whose memory is read (or the current rank).
        heap_bases: ``ctx.get_heap_bases()``.
        mask: lanes where ``mask`` is false are not read.
        other: value of masked-out lanes.
        cache_modifier: passed to ``tl.load``.
        volatile: passed to ``tl.load``.

    Returns:
        The loaded block.

    Example:
        >>> data = iris.load(buf + offs, cur_rank, peer, heap_bases, mask=offs < n)
    """
    cur, peer = _peer_of(to_rank, from_rank, heap_bases)
    return _read(pointer, cur, peer, heap_bases, mask, other, cache_modifier, volatile)


@triton.jit
def store(pointer, value, from_rank, to_rank, heap_bases, mask=None, cache_modifier=None):
    """Write ``value`` into ``to_rank``'s memory at ``pointer`` (local to ``from_rank``, the current rank).

    Example:
        >>> iris.store(buf + offs, 1, cur_rank, peer, heap_bases, mask=offs < n)
    """
    _write(pointer, as_element(value, pointer), from_rank, to_rank, heap_bases, mask, cache_modifier)


@triton.jit
def get(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, load_cache_modifier=None,
        store_cache_modifier=None):
    """Copy the other rank's ``from_ptr`` into the current rank's ``to_ptr``.

    Both pointers are in the current rank's address space. One of the two ranks is the current
    rank, the other is read, in either order: ``get(src, dst, peer, cur_rank, ...)`` and
    ``get(src, dst, cur_rank, peer, ...)`` both copy ``peer``'s ``src`` into the local ``dst``.
    ``load_cache_modifier`` (remote read) and ``store_cache_modifier`` (local write) go to ``tl.load`` and
    ``tl.store`` (None: Triton's default).

    Example:
        >>> iris.get(src + offs, dst + offs, peer, cur_rank, heap_bases, mask=offs < n)
    """
    cur, peer = _peer_of(from_rank, to_rank, heap_bases)
    if ENGINE:  # a run of lanes toward another node moves as one block transfer; the rest as below
        far = engine.far(peer, heap_bases)
        mask = engine.near_mask(mask, far & engine.move_run(False, from_ptr, to_ptr, peer, cur, heap_bases,
                                                           engine.and_mask(mask, far)))
    _store(to_ptr, _read(from_ptr, cur, peer, heap_bases, mask, None, load_cache_modifier, False), mask,
           store_cache_modifier)


@triton.jit
def put(from_ptr, to_ptr, from_rank, to_rank, heap_bases, mask=None, load_cache_modifier=None,
        store_cache_modifier=None):
    """Copy the current rank's (``from_rank``) ``from_ptr`` into ``to_rank``'s ``to_ptr``.

    Both pointers are in the current rank's address space. ``load_cache_modifier`` (of the local read) and
    ``store_cache_modifier`` (of the remote write) go to ``tl.load`` and ``tl.store`` (None: Triton's default).

    Example:
        >>> iris.put(src + offs, dst + offs, cur_rank, peer, heap_bases, mask=offs < n)
    """
    if ENGINE:
        tl.debug_barrier()  # every thread holding a lane makes its engine call: each must read what the program stored
        far = engine.far(to_rank, heap_bases)  # a run of lanes toward another node moves as one block transfer
        mask = engine.near_mask(mask, far & engine.move_run(True, to_ptr, from_ptr, to_rank, from_rank, heap_bases,
                                                           engine.and_mask(mask, far)))
    _write(to_ptr, _load(from_ptr, mask, None, load_cache_modifier, False), from_rank, to_rank, heap_bases, mask,
           store_cache_modifier)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, cur_rank, heap_bases, mask=None, load_cache_modifier=None,
         store_cache_modifier=None):
    """Copy ``from_rank``'s ``src_ptr`` to ``to_rank``'s ``dst_ptr``; both pointers local to ``cur_rank``.

    Any of the three ranks may be equal; a rank may move data between two peers. ``load_cache_modifier`` and
    ``store_cache_modifier`` go to the read's ``tl.load`` and the write's ``tl.store`` (None: Triton's default).

    Example:
        >>> iris.copy(src + offs, dst + offs, peer_a, peer_b, cur_rank, heap_bases, mask=offs < n)
    """
    data = _read(src_ptr, cur_rank, from_rank, heap_bases, mask, None, load_cache_modifier, False)
    _write(dst_ptr, data, cur_rank, to_rank, heap_bases, mask, store_cache_modifier)
