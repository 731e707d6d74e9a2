"""Flags between ranks: ``signal`` another rank's word, ``wait_until`` one's own word satisfies a comparison.

The defaults (release/acquire at system scope) publish every earlier write of the signalling program; a flag
at ``scope="gpu"`` is not ordered for another GPU. Wait only on other ranks or on lower program ids of your own
launch: programs of a launch need not run at once (the CPU backend runs them in turn).

Example (producer on rank 0, consumer on rank 1)::

    @triton.jit
    def handoff(data, flag, rank, heap_bases, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        if rank == 0:
            iris.store(data + offs, offs, 0, 1, heap_bases)
            iris.signal(flag, 1, 0, 1, heap_bases)          # release, sys
        else:
            iris.wait_until(flag, "==", 1)                   # acquire, sys
            tl.store(data + offs, tl.load(data + offs) + 1)
"""

import time

import triton
import triton.language as tl

from iris.device.rma import AMDGCN, PTX, as_element, debug_report, far_update, near_lanes, translate

COMPARISONS = ("==", "!=", ">=", ">", "<=", "<")

# Debug mode (or IRIS_STALL_TIMEOUT) bounds every wait; compile-time constants, so without them the spin loops
# carry nothing extra.
BOUNDED_WAITS = tl.constexpr(False)
WAIT_TIMEOUT_NS = tl.constexpr(10_000_000_000)
# s_memrealtime counts at 100 MHz on AMD Instinct GPUs.
_MEMREALTIME_NS_PER_TICK = tl.constexpr(10)
WAIT_UNTIL_RECORD = tl.constexpr(1)
DEVICE_BARRIER_RECORD = tl.constexpr(2)


def _host_clock_ns():
    return time.monotonic_ns()


# Lets Triton's dependency scan accept the name; compiled kernels never reach it (see _clock_ns).
_host_clock_ns.__triton_builtin__ = True


@triton.jit
def _clock_ns():
    if AMDGCN:
        ticks = tl.inline_asm_elementwise("s_memrealtime $0\n s_waitcnt lgkmcnt(0)", "=s", [], dtype=tl.int64,
                                          is_pure=False, pack=1)
        now = ticks * _MEMREALTIME_NS_PER_TICK
    elif PTX:
        now = tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                        pack=1)
    else:
        now = _host_clock_ns()  # only ever run by Triton's interpreter, which runs this body as Python
    return now


@triton.jit
def async_proxy_fence():
    """Order earlier acquires before later TMA loads, so tensor descriptors read what peers stored (NVIDIA only)."""
    if PTX:
        tl.inline_asm_elementwise("fence.proxy.async.global;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def _satisfied(seen, cmp: tl.constexpr, value):
    if cmp == "==":
        ok = seen == value
    elif cmp == "!=":
        ok = seen != value
    elif cmp == ">=":
        ok = seen >= value
    elif cmp == ">":
        ok = seen > value
    elif cmp == "<=":
        ok = seen <= value
    else:
        ok = seen < value
    return ok


@triton.jit
def _comparison_code(cmp: tl.constexpr):
    """The index of ``cmp`` in COMPARISONS (for the debug record)."""
    if cmp == "==":
        code = 0
    elif cmp == "!=":
        code = 1
    elif cmp == ">=":
        code = 2
    elif cmp == ">":
        code = 3
    elif cmp == "<=":
        code = 4
    else:
        code = 5
    return tl.full([], code, tl.int64)


@triton.jit
def signal(ptr, value, from_rank, to_rank, heap_bases, op: tl.constexpr = tl.constexpr("set"),
           sem: tl.constexpr = tl.constexpr("release"), scope: tl.constexpr = tl.constexpr("sys")):
    """Set (``op="set"``) or add to (``op="add"``) ``to_rank``'s word at ``ptr``; returns the old value.

    Args:
        ptr: a scalar pointer into the symmetric heap, in the current rank's (``from_rank``) space.
        value: the value to store or add, converted to the word's dtype.
        from_rank, to_rank, heap_bases: as for ``iris.store``.
        op: "set" (atomic exchange) or "add" (atomic add: counting signals from many senders).
        sem, scope: the atomic's ordering; the defaults publish the program's earlier writes.

    Example:
        >>> iris.signal(flags + pid, step, rank, peer, heap_bases)            # set
        >>> iris.signal(counter, 1, rank, owner, heap_bases, op="add")         # count
    """
    # String defaults are tl.constexpr: Triton 3.6 fails on a bare str default left unpassed.
    tl.static_assert(op == "set" or op == "add", "signal: op must be \"set\" or \"add\"")
    tl.debug_barrier()  # the release covers every thread's earlier writes, not only the issuing thread's
    near = near_lanes(to_rank, heap_bases, None)
    target = translate(ptr, from_rank, to_rank, heap_bases, near)
    word = as_element(value, ptr)
    if op == "set":
        old = tl.atomic_xchg(target, word, mask=near, sem=sem, scope=scope)
        old = far_update("xchg", old, ptr, word, from_rank, to_rank, heap_bases, None, sem)
    else:
        old = tl.atomic_add(target, word, mask=near, sem=sem, scope=scope)
        old = far_update("add", old, ptr, word, from_rank, to_rank, heap_bases, None, sem)
    return old


@triton.jit
def wait_until(ptr, cmp: tl.constexpr, value, sem: tl.constexpr = tl.constexpr("acquire"),
               scope: tl.constexpr = tl.constexpr("sys")):
    """Spin until the current rank's word at ``ptr`` compares ``cmp`` to ``value``; returns the value seen.

    Args:
        ptr: a scalar pointer to an integer word on the current rank's heap (or any memory it can read).
        cmp: one of "==", "!=", ">=", ">", "<=", "<" (compile-time).
        value: what the word is compared with.
        sem, scope: the ordering of each read; the defaults see what the matching signal published.

    Returns:
        The first value read that satisfied the comparison.

    Example:
        >>> seen = iris.wait_until(flag, ">=", step)
    """
    tl.static_assert(cmp == "==" or cmp == "!=" or cmp == ">=" or cmp == ">" or cmp == "<=" or cmp == "<",
                     "wait_until: cmp must be one of ==, !=, >=, >, <=, <")
    value = as_element(value, ptr)
    seen = tl.atomic_add(ptr, as_element(0, ptr), sem=sem, scope=scope)
    if BOUNDED_WAITS:
        start = _clock_ns()
        waited = start - start
        while (_satisfied(seen, cmp, value) == 0) & (waited < WAIT_TIMEOUT_NS):
            seen = tl.atomic_add(ptr, as_element(0, ptr), sem=sem, scope=scope)
            waited = _clock_ns() - start
        if _satisfied(seen, cmp, value) == 0:
            debug_report(WAIT_UNTIL_RECORD, ptr.to(tl.int64), value, seen, _comparison_code(cmp), waited)
    else:
        while not _satisfied(seen, cmp, value):
            seen = tl.atomic_add(ptr, as_element(0, ptr), sem=sem, scope=scope)
    # A scalar acquire orders only its own thread; the block barrier extends it to the whole program.
    tl.debug_barrier()
    return seen


@triton.jit
def _without_flag(words, flag, mask):
    """The lanes of ``mask`` whose int64 word does not carry ``flag`` in its high half."""
    return mask & ((words >> 32).to(tl.int32) != flag)


@triton.jit
def wait_flagged_words(ptr, flag, mask):
    """Spin until every ``mask`` lane of the int64 words at ``ptr`` carries ``flag`` in its high half; returns them.

    Data and flag arrive in one 8-byte store, so no fence or acquire is needed (NCCL's LL protocol).

    Example:
        >>> words = iris.device.sync.wait_flagged_words(slot + offs, count + 1, offs < n)
    """
    words = tl.load(ptr, mask=mask, other=0, volatile=True)
    # A scalar count: see barrier_round.
    late = tl.sum(_without_flag(words, flag, mask).to(tl.int32))
    if BOUNDED_WAITS:
        start = _clock_ns()
        waited = start - start
        while (late > 0) & (waited < WAIT_TIMEOUT_NS):
            words = tl.load(ptr, mask=mask, other=0, volatile=True)
            late = tl.sum(_without_flag(words, flag, mask).to(tl.int32))
            waited = _clock_ns() - start
        if late > 0:
            lanes = _without_flag(words, flag, mask)
            first = tl.min(tl.where(lanes, ptr.to(tl.int64), 0x7FFFFFFFFFFFFFFF))
            seen = tl.sum(tl.where(lanes & (ptr.to(tl.int64) == first), words >> 32, 0))
            debug_report(WAIT_UNTIL_RECORD, first, flag, seen, _comparison_code("=="), waited)
    else:
        while late > 0:
            words = tl.load(ptr, mask=mask, other=0, volatile=True)
            late = tl.sum(_without_flag(words, flag, mask).to(tl.int32))
    return words


@triton.jit
def barrier_kernel(arrivals, expected, members, count, cur, heap_bases, BLOCK: tl.constexpr):
    """One round of :meth:`iris.Iris.device_barrier` among ``members[:count]`` (one program)."""
    barrier_round(arrivals, expected, members, count, cur, heap_bases, BLOCK)


@triton.jit
def barrier_round(arrivals, expected, members, count, cur, heap_bases, BLOCK: tl.constexpr):
    """One device-barrier round among ``members[:count]``, inside any kernel; exactly one program calls it.

    ``arrivals[s]`` (symmetric) counts rounds rank s entered with this rank, ``expected[s]`` (local) the reverse;
    pairs count alike, so one pair of arrays serves every group and ``device_barrier()``.
    """
    offs = tl.arange(0, BLOCK)
    peers = tl.load(members + offs, mask=offs < count, other=0)
    others = (offs < count) & (peers != cur)
    tl.debug_barrier()  # every write this launch's stream made before precedes the arrival
    mine = arrivals + cur + offs * 0
    near = near_lanes(peers, heap_bases, others)
    tl.atomic_add(translate(mine, cur, peers, heap_bases, near), 1, mask=near, sem="release", scope="sys")
    far_update("post", tl.zeros([BLOCK], tl.int64), mine, 1, cur, peers, heap_bases, others, "release")
    want = tl.load(expected + peers, mask=others, other=0) + 1
    # Without this barrier a warp loading after the store waits one round too many.
    tl.debug_barrier()
    tl.store(expected + peers, want, mask=others)
    seen = tl.atomic_add(arrivals + peers, 0, mask=others, sem="acquire", scope="sys")
    if BOUNDED_WAITS:
        start = _clock_ns()
        waited = start - start
        while (tl.sum((others & (seen < want)).to(tl.int32)) > 0) & (waited < WAIT_TIMEOUT_NS):
            seen = tl.atomic_add(arrivals + peers, 0, mask=others, sem="acquire", scope="sys")
            waited = _clock_ns() - start
        late = others & (seen < want)
        if tl.sum(late.to(tl.int32)) > 0:
            first = tl.min(tl.where(late, offs, BLOCK))  # the lowest late lane
            lane = offs == first
            peer = tl.sum(tl.where(lane, peers, 0))
            debug_report(DEVICE_BARRIER_RECORD, (arrivals + peer).to(tl.int64), tl.sum(tl.where(lane, want, 0)),
                            tl.sum(tl.where(lane, seen, 0)), peer, waited)
    else:
        # A scalar count: a loop condition from the carried tensor crashes Triton 3.6's layout pass.
        late = tl.sum((others & (seen < want)).to(tl.int32))
        while late > 0:
            seen = tl.atomic_add(arrivals + peers, 0, mask=others, sem="acquire", scope="sys")
            late = tl.sum((others & (seen < want)).to(tl.int32))
