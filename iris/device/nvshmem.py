"""The path toward ranks on another node: NVSHMEM's device calls, on the shmem heap.

A rank on another node has heap base 0 in the context tensor. With :data:`ON` (set by the shmem heap of a job
across nodes), every remote access of :mod:`iris.device.rma`, :mod:`iris.device.atomics` and
:mod:`iris.device.sync` splits its lanes: near ranks take the pointer path, far ones call NVSHMEM here.

Why it looks odd: an extern call cannot be predicated per lane, so lanes that must not touch memory are
pointed at the current rank's engine scratch word; several threads may make one lane's call, so written
values must be read after a barrier, and atomics are made by thread 0 alone. Atomics NVSHMEM lacks are
compare-and-swap loops. Consecutive runs move with one block-wide ``putmem``/``getmem``; small block reads
land in a staging slot of this rank's heap first.

Example (what ``iris.store`` compiles to toward rank ``peer`` when the job spans nodes)::

    far = engine.far(peer, heap_bases)              # this lane's rank is on another node
    engine.put_values(pointer, value, peer, cur, heap_bases, engine.and_mask(mask, far))
"""

import triton
import triton.language as tl
from triton.language import core

# Compile the engine path (set by the shmem heap of a job across nodes).
ON = tl.constexpr(False)

# The scratch word's address lies past the bases, the tracing fields and the debug word.
_WORLD_BEFORE_BASES = tl.constexpr(1)  # rma.HEAP_BASES_SLOT - rma.WORLD_SLOT
SCRATCH_AFTER_BASES = tl.constexpr(18)

# Staging slots for block reads (a getmem needs memory the transport can write), then a lock word per slot,
# just below the scratch word in every shmem heap's reserved tail.
STAGING_SLOTS = tl.constexpr(256)
STAGING_BYTES = tl.constexpr(8192)


#: every NVSHMEM device function the engine path calls (what iris.memory.providers.engine_library keeps)
SYMBOLS: tuple[str, ...] = ()


def _extern(signatures: dict[tuple[str, ...], tuple[str, str]]):
    """An NVSHMEM device function called once per lane; ``signatures`` maps argument types to (symbol, result)."""
    global SYMBOLS
    SYMBOLS += tuple(symbol for symbol, _ in signatures.values())
    table = {tuple(core.dtype(t) for t in args): (symbol, core.dtype(result))
             for args, (symbol, result) in signatures.items()}

    @core.extern
    def call(*args, _semantic=None):
        return core.extern_elementwise("", "", list(args), table, is_pure=False, _semantic=_semantic)

    call.__name__ = "/".join(symbol for symbol, _ in signatures.values())
    return call


def _by_width(name: str, widths: tuple[int, ...], operands: int, result: str | None):
    """``nvshmem_uint<w>_<name>`` for each width w: (address, ``operands`` words, PE) -> old word or ``result``."""
    return _extern({("int64",) + (f"uint{w}",) * operands + ("int32",):
                    (f"nvshmem_uint{w}_{name}", result or f"uint{w}") for w in widths})


# Reads take no word, so their result type cannot pick the width: one function per width.
_get8, _get16, _get32, _get64 = (_extern({("int64", "int32"): (f"nvshmem_uint{w}_g", f"uint{w}")})
                                 for w in (8, 16, 32, 64))
_put = _by_width("p", (8, 16, 32, 64), 1, "int32")
_fetch_add = _by_width("atomic_fetch_add", (32, 64), 1, None)
_add = _by_width("atomic_add", (32, 64), 1, "int32")  # no old value: waits for no reply
_swap = _by_width("atomic_swap", (32, 64), 1, None)
_compare_swap = _by_width("atomic_compare_swap", (32, 64), 2, None)
# A run of bytes, moved by every thread of the program together (each makes the same call).
_putmem_block = _extern({("int64", "int64", "int64", "int32"): ("nvshmemx_putmem_block", "int32")})
_getmem_block = _extern({("int64", "int64", "int64", "int32"): ("nvshmemx_getmem_block", "int32")})
_fence = _extern({(): ("nvshmem_fence", "int32")})
_quiet = _extern({(): ("nvshmem_quiet", "int32")})


@triton.jit
def iris_engine_probe(address, pe):
    """Calls each of :data:`SYMBOLS` once: compiled only to cut NVSHMEM's library to what they need."""
    u8 = _get8(address, pe)
    u16 = _get16(address, pe)
    u32 = _get32(address, pe)
    u64 = _get64(address, pe)
    _put(address, u8, pe)
    _put(address, u16, pe)
    _put(address, u32, pe)
    _put(address, u64, pe)
    a32 = _fetch_add(address, u32, pe) + _swap(address, u32, pe) + _compare_swap(address, u32, u32, pe)
    a64 = _fetch_add(address, u64, pe) + _swap(address, u64, pe) + _compare_swap(address, u64, u64, pe)
    _add(address, a32, pe)
    _add(address, a64, pe)
    _putmem_block(address, address, u64.to(tl.int64), pe)
    _getmem_block(address, address, u64.to(tl.int64), pe)
    _fence()
    _quiet()


@triton.jit
def far(rank, heap_bases):
    """Whether ``rank`` (a scalar or a block of ranks) is reached through the engine: its base is 0."""
    return tl.load(heap_bases + rank) == 0


@triton.jit
def and_mask(mask, lanes):
    """``mask & lanes``, where a mask of None selects every lane."""
    if mask is None:
        result = lanes
    else:
        result = mask & lanes
    return result


@triton.jit
def near_mask(mask, far_lanes):
    """The lanes of ``mask`` (None: all) that take the pointer path."""
    return and_mask(mask, far_lanes == 0)


@triton.jit
def any_lane(lanes):
    """Whether any lane of ``lanes`` (a scalar or a block of any rank) is set, as a scalar."""
    return tl.max((lanes | tl.zeros([1], tl.int1)).to(tl.int32)) > 0


@triton.jit
def _as_words(x, bits: tl.constexpr):
    """``x`` bit for bit as unsigned words of ``bits`` bits (the engine's element types); a bool as a byte."""
    tl.static_assert(bits == 8 or bits == 16 or bits == 32 or bits == 64, "the engine moves 8/16/32/64-bit elements")
    if x.dtype == tl.int1:
        words = x.to(tl.uint8)
    elif bits == 8:
        words = x.to(tl.uint8, bitcast=True)
    elif bits == 16:
        words = x.to(tl.uint16, bitcast=True)
    elif bits == 32:
        words = x.to(tl.uint32, bitcast=True)
    else:
        words = x.to(tl.uint64, bitcast=True)
    return words


@triton.jit
def _from_words(words, element: tl.constexpr):
    """Words read by the engine as elements of ``element``'s type (the inverse of _as_words)."""
    if element == tl.int1:
        result = words != 0
    else:
        result = words.to(element, bitcast=True)
    return result


@triton.jit
def _scratch_address(heap_bases):
    """The address of the current rank's engine scratch word (from the context tensor)."""
    world = tl.load(heap_bases - _WORLD_BEFORE_BASES)
    return tl.load(heap_bases + world + SCRATCH_AFTER_BASES)


@triton.jit
def _targets(pointer, rank, cur, heap_bases, lanes):
    """(address, PE) of each lane's call: ``pointer`` on ``rank`` where ``lanes``, else the scratch word here."""
    address = tl.where(lanes, pointer.to(tl.int64), _scratch_address(heap_bases))
    pe = tl.where(lanes, rank, cur).to(tl.int32)
    return address, pe


@triton.jit
def scratch_pointer(pointer, heap_bases):
    """The engine scratch word of the current rank, typed as ``pointer``."""
    return _scratch_address(heap_bases).to(tl.pointer_type(pointer.dtype.element_ty))


@triton.jit
def _get(address, pe, bits: tl.constexpr):
    """The ``bits``-bit words at ``address`` on ``pe`` (a read has no word whose type could pick the width)."""
    if bits == 8:
        words = _get8(address, pe)
    elif bits == 16:
        words = _get16(address, pe)
    elif bits == 32:
        words = _get32(address, pe)
    else:
        words = _get64(address, pe)
    return words


@triton.jit
def get_values(pointer, rank, cur, heap_bases, lanes):
    """Read ``rank``'s ``pointer`` (local to the current rank ``cur``) in the ``lanes`` selected, as raw
    unsigned words of the element's width (other lanes: the scratch word's)."""
    address, pe = _targets(pointer, rank, cur, heap_bases, lanes)
    bits: tl.constexpr = 8 if pointer.dtype.element_ty == tl.int1 else pointer.dtype.element_ty.primitive_bitwidth
    return _get(address, pe, bits)


@triton.jit
def acquire_slot(locks, start):
    """Take the first free staging slot from ``start`` on; holders wait on nothing, so this cannot deadlock."""
    slot = start % STAGING_SLOTS
    while tl.atomic_cas(locks + slot, 0, 1, sem="acquire", scope="gpu") != 0:
        slot = (slot + 1) % STAGING_SLOTS
    return slot


@triton.jit
def release_slot(locks, slot):
    """Give staging slot ``slot`` back, after every thread of the program is done with it."""
    tl.debug_barrier()
    tl.atomic_xchg(locks + slot, 0, sem="release", scope="gpu")


@triton.jit
def _staging_locks(heap_bases):
    """The staging slots' lock words: just below the scratch word (see STAGING_SLOTS)."""
    return (_scratch_address(heap_bases) - STAGING_SLOTS * 4).to(tl.pointer_type(tl.int32))


@triton.jit
def _staged_read(near, pointer, rank, cur, heap_bases, lanes):
    """(whether it did, ``near`` with ``lanes`` read): runs read by getmem into a staging slot, loaded from there."""
    locks = _staging_locks(heap_bases)
    slot = acquire_slot(locks, tl.program_id(0) + tl.program_id(1) * 61 + tl.program_id(2) * 127)
    slot_start = locks.to(tl.int64) - (STAGING_SLOTS - slot) * STAGING_BYTES
    index = tl.reshape(tl.arange(0, pointer.numel), pointer.shape)
    stage = slot_start.to(tl.pointer_type(pointer.dtype.element_ty)) + index
    result = near
    staged = move_run(False, pointer, stage, rank, cur, heap_bases, lanes)
    if staged:  # volatile: the transport may have written the slot past this SM's cache
        result = tl.where(lanes, tl.load(stage, mask=lanes, volatile=True), near)
    release_slot(locks, slot)
    return staged, result


@triton.jit
def read(near, pointer, rank, cur, heap_bases, far_lanes, mask):
    """``near`` with the far lanes of ``mask`` read through the engine (staged runs, else one read per lane)."""
    lanes = and_mask(mask, far_lanes)
    result = near
    if any_lane(lanes):
        staged = any_lane(lanes) & False
        bits: tl.constexpr = 8 if pointer.dtype.element_ty == tl.int1 else pointer.dtype.element_ty.primitive_bitwidth
        if pointer.type.is_block():
            if pointer.numel * bits <= STAGING_BYTES * 8:
                staged, result = _staged_read(near, pointer, rank, cur, heap_bases, lanes)
        if not staged:
            words = get_values(pointer, rank, cur, heap_bases, lanes)
            result = tl.where(lanes, _from_words(words, pointer.dtype.element_ty), near)
    return result


@triton.jit
def put_values(pointer, value, rank, cur, heap_bases, lanes):
    """Write ``value`` (the element type's) into ``rank``'s ``pointer`` in the ``lanes`` selected."""
    if any_lane(lanes):
        address, pe = _targets(pointer, rank, cur, heap_bases, lanes)
        bits: tl.constexpr = 8 if pointer.dtype.element_ty == tl.int1 else pointer.dtype.element_ty.primitive_bitwidth
        _put(address, _as_words(value, bits), pe)


@triton.jit
def _runs(remote, local, rank, cur, heap_bases, lanes, index, AXIS: tl.constexpr):
    """The runs of ``lanes`` of ``remote`` (on ``rank``) and ``local`` along ``AXIS`` (None: whole block; 1: rows).

    Returns (ok, remote start, local start, bytes, rank): ok where every run is consecutive on both sides,
    toward one rank, its local side in this rank's heap. Few reductions: this is in every far put and get."""
    size: tl.constexpr = 1 if remote.dtype.element_ty == tl.int1 else remote.dtype.element_ty.primitive_bitwidth // 8
    selected = lanes & (index >= 0)  # a block even where lanes is one flag
    ranks = rank + tl.zeros(remote.shape, tl.int32)
    far_start = remote.to(tl.int64) - index.to(tl.int64) * size  # the same in every lane of a run
    offset = local.to(tl.int64) - remote.to(tl.int64)  # the same in every lane of a run
    first = tl.min(tl.where(selected, index, remote.numel), axis=AXIS)
    count = tl.sum(selected.to(tl.int32), axis=AXIS)
    remote_start = tl.min(tl.where(selected, far_start, 0x7FFFFFFFFFFFFFFF), axis=AXIS)
    local_offset = tl.min(tl.where(selected, offset, 0x7FFFFFFFFFFFFFFF), axis=AXIS)
    pe = tl.min(tl.where(selected, ranks, 0x7FFFFFFF))
    if AXIS is None:
        lane_first, lane_count, lane_start, lane_offset = first, count, remote_start, local_offset
    else:  # each row's figures beside its lanes
        lane_first, lane_count = first[:, None], count[:, None]
        lane_start, lane_offset = remote_start[:, None], local_offset[:, None]
    astray = selected & ((index >= lane_first + lane_count) | (far_start != lane_start) | (offset != lane_offset)
                         | (ranks != pe))
    remote_first = remote_start + first.to(tl.int64) * size
    local_first = remote_first + local_offset
    nbytes = count.to(tl.int64) * size
    inside = (count == 0) | ((local_first >= tl.load(heap_bases + cur))
                             & (local_first + nbytes <= _scratch_address(heap_bases)))
    ok = any_lane(count > 0) & ~any_lane(astray) & ~any_lane(~inside)
    return ok, remote_first, local_first, nbytes, pe.to(tl.int32)


@triton.jit
def _run(remote, local, rank, cur, heap_bases, lanes):
    """_runs over the whole block as one run in lane order."""
    index = tl.reshape(tl.arange(0, remote.numel), remote.shape)
    return _runs(remote, local, rank, cur, heap_bases, lanes, index, None)


@triton.jit
def _row_runs(remote, local, rank, cur, heap_bases, lanes):
    """_runs row by row, for a tile of a wider matrix."""
    column = tl.arange(0, remote.shape[1])[None, :] + tl.zeros(remote.shape, tl.int32)
    return _runs(remote, local, rank, cur, heap_bases, lanes, column, 1)


@triton.jit
def _row_of(values, row):
    """Row ``row``'s entry of a per-row vector, as a scalar (the same in every thread)."""
    return tl.sum(tl.where(tl.arange(0, values.shape[0]) == row, values, 0))


@triton.jit
def _move(PUT: tl.constexpr, far_start, near_start, nbytes, pe):
    if PUT:
        _putmem_block(far_start, near_start, nbytes, pe)
    else:
        _getmem_block(near_start, far_start, nbytes, pe)


@triton.jit
def move_run(PUT: tl.constexpr, remote, local, rank, cur, heap_bases, lanes):
    """Move ``lanes`` between ``local`` and ``rank``'s ``remote`` with one block-wide call per run (PUT: to
    remote); returns whether it did, so no lane needs a call of its own."""
    moved = any_lane(lanes) & False
    if remote.type.is_block():
        if any_lane(lanes):
            moved, far_start, near_start, nbytes, pe = _run(remote, local, rank, cur, heap_bases, lanes)
            if moved:
                _move(PUT, far_start, near_start, nbytes, pe)
            elif len(remote.shape) == 2:
                moved, far_rows, near_rows, row_bytes, pe = _row_runs(remote, local, rank, cur, heap_bases, lanes)
                if moved:
                    for row in range(0, remote.shape[0]):
                        nbytes = _row_of(row_bytes, row)
                        if nbytes > 0:
                            _move(PUT, _row_of(far_rows, row), _row_of(near_rows, row), nbytes, pe)
            if not PUT:
                tl.debug_barrier()
    return moved


@triton.jit
def fence():
    """Order this thread's earlier engine puts and atomics to each rank before its later ones (a release)."""
    _fence()


@triton.jit
def quiet():
    """Wait until this thread's engine puts and atomics are complete everywhere."""
    _quiet()


@triton.jit
def _combine(op: tl.constexpr, old, val):
    if op == "add":
        result = old + val
    elif op == "min":
        result = tl.minimum(old, val)
    elif op == "max":
        result = tl.maximum(old, val)
    elif op == "and":
        result = old & val
    elif op == "or":
        result = old | val
    elif op == "xor":
        result = old ^ val
    else:  # "xchg"
        result = val + old * 0
    return result


@triton.jit
def _thread_index(like):
    """This thread's index in its program (``%tid.x``; Triton's programs are one-dimensional)."""
    return tl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,l", [like], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _from_first_thread(words):
    """Thread 0's scalar ``words`` in every thread: an atomic's result exists only where it was made."""
    first = (tl.arange(0, 1024) == 0) & (_thread_index(words.to(tl.int64)) == 0)
    return tl.sum(tl.where(first, words, 0), axis=0).to(words.dtype)


@triton.jit
def _one_half_update(op: tl.constexpr, at, val, at_pe, element: tl.constexpr):
    """A 16-bit atomic as a compare-and-swap loop on its 32-bit word (NVSHMEM has none)."""
    word_at = (at // 4) * 4  # thread 0's word; the scratch word in the others, whose calls change nothing
    shift = _from_first_thread(((at - word_at) * 8).to(tl.uint32))  # thread 0's half, in every thread
    others = ~(tl.full((), 0xFFFF, tl.uint32) << shift)
    old = _from_first_thread(_get32(word_at, at_pe))
    seen = old + 1
    while seen != old:
        half = ((old >> shift) & 0xFFFF).to(tl.uint16)
        if op == "cas":
            new_half = tl.where(half == _as_words(val[0], 16), _as_words(val[1], 16), half)
        else:
            new_half = _as_words(_combine(op, half.to(element, bitcast=True), val), 16)
        desired = (old & others) | (new_half.to(tl.uint32) << shift)
        seen = _from_first_thread(_compare_swap(word_at, old, desired, at_pe))
        swapped = seen == old
        old = seen
        seen = tl.where(swapped, old, old + 1)
    return ((old >> shift) & 0xFFFF).to(tl.uint16)


@triton.jit
def _one_update(op: tl.constexpr, address, val, pe, cur, scratch, element: tl.constexpr):
    """One element's atomic toward ``pe``, made by thread 0 alone (others would count again); all get the old value."""
    bits: tl.constexpr = element.primitive_bitwidth
    alone = _thread_index(address) == 0
    at = tl.where(alone, address, scratch)
    at_pe = tl.where(alone, pe, cur).to(tl.int32)
    if bits == 16:
        old = _one_half_update(op, at, val, at_pe, element)
    elif op == "add" and element.is_int():
        old = _from_first_thread(_fetch_add(at, _as_words(val, bits), at_pe))
    elif op == "post":  # an integer add whose old value nobody reads: NVSHMEM's add, which waits for no reply
        tl.static_assert(element.is_int(), "post: an integer add")
        _add(at, _as_words(val, bits), at_pe)
        old = _as_words(val, bits) * 0
    elif op == "xchg":
        old = _from_first_thread(_swap(at, _as_words(val, bits), at_pe))
    elif op == "cas":  # val: (compare, desired) as one pair of words
        old = _from_first_thread(_compare_swap(at, _as_words(val[0], bits), _as_words(val[1], bits), at_pe))
    else:  # a compare-and-swap loop
        old = _from_first_thread(_get(at, at_pe, bits))
        seen = old + 1
        while seen != old:
            desired = _as_words(_combine(op, old.to(element, bitcast=True), val), bits)
            seen = _from_first_thread(_compare_swap(at, old, desired, at_pe))
            swapped = seen == old
            old = seen
            seen = tl.where(swapped, old, old + 1)
    return old.to(element, bitcast=True)


@triton.jit
def _lane_value(values, lane, element: tl.constexpr):
    """The one lane of ``values`` where ``lane`` is set, as a scalar of ``element`` (bit for bit)."""
    words = _as_words(values, element.primitive_bitwidth)
    return tl.sum(tl.where(lane, words, 0)).to(words.dtype).to(element, bitcast=True)


@triton.jit
def update(op: tl.constexpr, near, pointer, val, rank, cur, heap_bases, lanes, sem: tl.constexpr):
    """The atomic ``op`` of ``val`` on ``rank``'s ``pointer`` in ``lanes``; ``near`` with their old values.

    "post" is an add whose old values nobody reads; "cas" takes ``val`` as (compare, desired). A release
    first fences the engine's earlier puts and atomics."""
    element: tl.constexpr = pointer.dtype.element_ty
    bits: tl.constexpr = element.primitive_bitwidth
    result = near
    if any_lane(lanes):
        tl.static_assert(bits >= 16, "atomics toward a rank on another node take 16-, 32- or 64-bit words")
        if sem != "relaxed" and sem != "acquire":
            _fence()
        scratch = _scratch_address(heap_bases)
        if pointer.type.is_block():
            count: tl.constexpr = pointer.numel
            index = tl.reshape(tl.arange(0, count), pointer.shape)
            addresses = pointer.to(tl.int64)
            ranks = rank + tl.zeros(pointer.shape, tl.int32)
            selected = lanes & (index >= 0)
            if op == "cas":
                values0 = val[0] + tl.zeros(pointer.shape, element)
                values1 = val[1] + tl.zeros(pointer.shape, element)
            else:
                values0 = val + tl.zeros(pointer.shape, element)
                values1 = values0
            for i in range(count):  # lane i's scalars: sums over that lane alone (the same in every thread)
                lane = index == i
                if tl.sum(tl.where(lane & selected, 1, 0)) > 0:  # a lane that is off makes no call
                    address = tl.sum(tl.where(lane, addresses, 0))
                    pe = tl.sum(tl.where(lane, ranks, 0))
                    if op == "cas":
                        operand = (_lane_value(values0, lane, element), _lane_value(values1, lane, element))
                    else:
                        operand = _lane_value(values0, lane, element)
                    result = tl.where(lane, _one_update(op, address, operand, pe, cur, scratch, element), result)
        else:  # a scalar: any_lane above says it is on
            result = _one_update(op, pointer.to(tl.int64), val, rank, cur, scratch, element)
    return result
