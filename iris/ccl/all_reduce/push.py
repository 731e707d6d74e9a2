"""all_reduce's push variant: one launch, no barrier; each member pushes its input into every other member's
landing zone, then reduces what landed.

The barrier variants spend two device barriers per call (one before: every member's input is
ready; one after: nobody still reads it), each a round of flags over the link. Here a member never
reads another's memory: program p of each member stores its blocks of the input into every other
member's landing zone and sets a flag there (release), then waits for the flags of every other
member's program p (acquire) and sums, in member order, its own input and what landed. One
exchange of flags instead of two barriers, and nothing for the host to wait for: a call can be
captured in a CUDA graph and replayed.

The landing zones are reused, so they are double-buffered and counted per pair of members: for each
peer and program, a member counts the pushes it sent (``counts[0]``) and received (``counts[1]``);
push n goes to slot n % 2 with flag value n + 1. A member's push n + 2 to a peer comes after its
call that received the peer's push n + 1, which the peer made in a call after the one that read
push n: slot n % 2 is free again. Counting per pair, not per call, keeps members that also meet in
other groups in step.

A call that fails part-way on one member (a launch error) leaves that pair's counts apart, and later
push calls between them wait for a flag that will not come (in debug mode every device wait is
bounded by IRIS_WAIT_TIMEOUT and raises :class:`iris.WaitTimeoutError`): make a new context.

Memory: the heap's reserved tail holds, per rank, 2 x world x PUSH_BYTES of landing zones and
2 x world x PUSH_PROGRAMS flags (:func:`iris.host.team.reserved_layout`); a message may be at most
PUSH_BYTES per rank.

The ll variant (low latency, as NCCL's LL protocol) drops the flags: each 8-byte word carries data in its
low half and the push's number in its high half, stored at once. A reader spins on the words themselves
(:func:`iris.device.sync.wait_flagged_words`) and may sum a block as soon as its words carry the number:
no release fence before a flag, no separate flag round, and the blocks of one program are read as they
land. A word carries one element (4x the data's bytes for 16-bit ones, at most LL_UNPACKED elements per
rank) or, past LL_UNPACKED 16-bit elements (always with IRIS_LL_PACK=1, never with 0), two of them (2x the
bytes, at most LL_WORDS words per rank): :func:`holds`, :func:`ll_pack`. On GPUs a message spreads over
PUSH_PROGRAMS programs in blocks of at least LL_BLOCK words (:func:`launch_shape`). Its landing words and counts are its
own (a word a push call left there holds raw data, which could carry any number). Toward a rank on another node
(the shmem heap's engine path) each word goes as one 8-byte put of the engine: compiled in, not yet run there.

Example:
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="push"))
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="ll"))
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris.device import rma, sync, tracing
from iris.device.barrier import GROUP_ARGS
from iris.device.tracing import elements_bytes, tracing_from_context
from iris.ccl.reduction import combine
from iris.host.replay import bind
from iris import config
from iris.host.team import LL_UNPACKED, LL_WORDS, PUSH_BYTES, PUSH_PROGRAMS

# The smallest block (words) of an ll launch on a GPU (see launch_shape): small, so that small messages fill the
# programs. On 2 x H200, replayed after a GEMM as a decode step runs it: 16 KiB of bfloat16 4.4 us
# in blocks of 64 words (128 programs) against 5.9 us in blocks of 1024 (8 programs).
LL_BLOCK = 64


@triton.jit
def _slot(base, count_word, rank, WORLD: tl.constexpr, SIZE: tl.constexpr):
    """The slot of ``rank`` in the buffer half (count % 2) a push numbered by ``count_word`` uses."""
    return base + ((tl.load(count_word) % 2) * WORLD + rank) * SIZE


@triton.jit
def _member_block(src, landing, received, members, j, cur, offs, mask, WORLD: tl.constexpr, PROGRAMS: tl.constexpr,
                  CAPACITY: tl.constexpr, BLOCK: tl.constexpr):
    """Member ``j``'s block at ``offs``: this member's own from ``src``, a peer's from its slot here.

    No branch, two masked loads. The lanes' test is a block, not a scalar: Triton 3.9's interpreter
    turns a block mask & a scalar bool into int32 and refuses it as a mask.
    """
    member = tl.load(members + j)
    lanes = member + tl.zeros([BLOCK], tl.int32)
    landed = _slot(landing, received + member * PROGRAMS, member, WORLD, CAPACITY)
    return tl.where(lanes == cur, tl.load(src + offs, mask=mask & (lanes == cur)),
                    tl.load(landed + offs, mask=mask & (lanes != cur), volatile=True))


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_reduce_push_kernel(src, dst, numel, blocks, members, count, index, cur, heap_bases, landing, flags, counts,
                            WORLD: tl.constexpr, PROGRAMS: tl.constexpr, CAPACITY: tl.constexpr, OP: tl.constexpr,
                            ACC: tl.constexpr, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    program = tl.program_id(0)
    busy = program < blocks  # a program without blocks this call only counts it (launch_shape)
    trace = tracing_from_context(heap_bases - rma.HEAP_BASES_SLOT, WORLD, TRACE)  # records nothing unless TRACE
    sent = counts + program  # sent[peer] at sent + peer * PROGRAMS; received after WORLD * PROGRAMS words
    received = counts + WORLD * PROGRAMS + program
    for i in range(1, count):  # push: this program's blocks into every other member's slot for this rank
        peer = tl.load(members + (index + i) % count)
        slot = _slot(landing, sent + peer * PROGRAMS, cur, WORLD, CAPACITY)
        span = trace.start(tracing.PUT, cur, peer, slot, -1, -1, elements_bytes(src, numel))
        for block in range(program, blocks, tl.num_programs(0)):
            offs = tl.cast(block, tl.int64) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < numel
            rma.put(src + offs, slot + offs, cur, peer, heap_bases, mask=mask)  # across nodes: one block transfer
        tl.debug_barrier()  # every thread's stores before the flag
        trace.end(span)
        pushes = tl.load(sent + peer * PROGRAMS) + 1
        flag = _slot(flags, sent + peer * PROGRAMS, cur, WORLD, PROGRAMS) + program
        if busy:
            trace.start(tracing.SIGNAL, cur, peer, flag, -1, -1, 4)  # an instant: no end
            sync.signal(flag, pushes, cur, peer, heap_bases)
        tl.store(sent + peer * PROGRAMS, pushes)
    for i in range(1, count):  # wait for every other member's push of the same program
        peer = tl.load(members + (index + i) % count)
        expected = tl.load(received + peer * PROGRAMS) + 1
        flag = _slot(flags, received + peer * PROGRAMS, peer, WORLD, PROGRAMS) + program
        if busy:
            span = trace.start(tracing.WAIT, cur, cur, flag, -1, -1, 0)
            sync.wait_until(flag, "==", expected)
            trace.end(span)
    tl.debug_barrier()  # the acquire before any thread reads what landed
    span = trace.start(tracing.REDUCE, cur, cur, dst, -1, -1, elements_bytes(src, numel))
    for block in range(program, blocks, tl.num_programs(0)):  # sum in member order: the same bits everywhere
        offs = tl.cast(block, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < numel
        acc = _member_block(src, landing, received, members, 0, cur, offs, mask, WORLD, PROGRAMS, CAPACITY,
                            BLOCK).to(ACC)  # the loop keeps acc's type: ACC from the start
        for j in range(1, count):
            x = _member_block(src, landing, received, members, j, cur, offs, mask, WORLD, PROGRAMS, CAPACITY, BLOCK)
            acc = combine(acc, x.to(ACC), OP)
        tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)
    trace.end(span)
    tl.debug_barrier()  # every thread's reads of the counts above before one thread moves them on
    for i in range(1, count):  # count the receipts only now: the reads above used the slot they arrived in
        peer = tl.load(members + (index + i) % count)
        tl.store(received + peer * PROGRAMS, tl.load(received + peer * PROGRAMS) + 1)


@triton.jit
def _bits(x):
    """The bits of 16- or 32-bit elements ``x`` in the low half(s) of int32 lanes (16-bit ones zero-extended)."""
    if x.dtype.primitive_bitwidth == 16:
        bits = x.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    else:
        bits = x.to(tl.int32, bitcast=True)
    return bits


@triton.jit
def _words(src, w, numel, flag, PACK: tl.constexpr):
    """Words ``w`` of ``src``: PACK elements each (elements PACK * w + k at bits 16 * k), ``flag`` in the high
    half; an element past ``numel`` is 0."""
    e = w * PACK
    bits = _bits(tl.load(src + e, mask=e < numel, other=0))
    if PACK == 2:
        bits = bits | (_bits(tl.load(src + e + 1, mask=e + 1 < numel, other=0)) << 16)
    return (flag.to(tl.int64) << 32) | (bits.to(tl.int64) & 0xFFFFFFFF)


@triton.jit
def _element(bits, like, ACC: tl.constexpr):
    """The element of ``like``'s element type in int32 ``bits`` (a 16-bit one in their low half), in ``ACC``.
    A bfloat16 goes through float32 (its bits are a float32's high half): Triton's interpreter has no
    bfloat16 bitcast."""
    if like.dtype.element_ty == tl.bfloat16:
        x = (bits << 16).to(tl.float32, bitcast=True)
    elif like.dtype.element_ty.primitive_bitwidth == 16:
        x = bits.to(tl.int16).to(like.dtype.element_ty, bitcast=True)
    else:
        x = bits.to(like.dtype.element_ty, bitcast=True)
    return x.to(ACC)


@triton.jit
def _ll_member_block(src, landing, received, members, j, cur, w, numel, WORLD: tl.constexpr,
                     PROGRAMS: tl.constexpr, CAPACITY: tl.constexpr, ACC: tl.constexpr, PACK: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Member ``j``'s elements of words ``w`` in ``ACC``, as (first, second) of each word (the second is the
    first again where PACK is 1): this member's own from ``src``, a peer's from its words here once they
    carry its push's number (no lane waits for this member's own)."""
    member = tl.load(members + j)
    own = (member + tl.zeros([BLOCK], tl.int32)) == cur
    counted = received + member * PROGRAMS
    e = w * PACK
    words = sync.wait_flagged_words(_slot(landing, counted, member, WORLD, CAPACITY) + w, tl.load(counted) + 1,
                                    (e < numel) & ~own)
    low = words.to(tl.int32)
    first = tl.where(own, tl.load(src + e, mask=(e < numel) & own).to(ACC), _element(low, src, ACC))
    second = first
    if PACK == 2:
        second = tl.where(own, tl.load(src + e + 1, mask=(e + 1 < numel) & own).to(ACC),
                          _element(low >> 16, src, ACC))
    return first, second


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_reduce_ll_kernel(src, dst, numel, blocks, members, count, index, cur, heap_bases, landing, counts,
                          WORLD: tl.constexpr, PROGRAMS: tl.constexpr, CAPACITY: tl.constexpr, OP: tl.constexpr,
                          ACC: tl.constexpr, PACK: tl.constexpr, BLOCK: tl.constexpr, TRACE: tl.constexpr):
    program = tl.program_id(0)
    trace = tracing_from_context(heap_bases - rma.HEAP_BASES_SLOT, WORLD, TRACE)  # records nothing unless TRACE
    sent = counts + program  # as in _all_reduce_push_kernel: [sent | received][rank][program]
    received = counts + WORLD * PROGRAMS + program
    for i in range(1, count):  # push: this program's blocks of words, PACK elements beside the push's number each
        peer = tl.load(members + (index + i) % count)
        flag = tl.load(sent + peer * PROGRAMS) + 1
        slot = _slot(landing, sent + peer * PROGRAMS, cur, WORLD, CAPACITY)
        span = trace.start(tracing.PUT, cur, peer, slot, -1, -1, 8 * ((numel + PACK - 1) // PACK))
        for block in range(program, blocks, tl.num_programs(0)):
            w = tl.cast(block, tl.int64) * BLOCK + tl.arange(0, BLOCK)
            rma.store(slot + w, _words(src, w, numel, flag, PACK), cur, peer, heap_bases, mask=w * PACK < numel)
        trace.end(span)
    span = trace.start(tracing.REDUCE, cur, cur, dst, -1, -1, elements_bytes(src, numel))
    for block in range(program, blocks, tl.num_programs(0)):  # sum in member order: the same bits everywhere
        w = tl.cast(block, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        first, second = _ll_member_block(src, landing, received, members, 0, cur, w, numel, WORLD, PROGRAMS,
                                         CAPACITY, ACC, PACK, BLOCK)
        for j in range(1, count):
            x, y = _ll_member_block(src, landing, received, members, j, cur, w, numel, WORLD, PROGRAMS, CAPACITY,
                                    ACC, PACK, BLOCK)
            first = combine(first, x, OP)
            second = combine(second, y, OP)
        e = w * PACK
        tl.store(dst + e, first.to(dst.dtype.element_ty), mask=e < numel)
        if PACK == 2:
            tl.store(dst + e + 1, second.to(dst.dtype.element_ty), mask=e + 1 < numel)
    trace.end(span)
    tl.debug_barrier()  # every thread's reads of the counts above before one thread moves them on
    for i in range(1, count):  # this call's pushes and receipts, counted
        peer = tl.load(members + (index + i) % count)
        tl.store(sent + peer * PROGRAMS, tl.load(sent + peer * PROGRAMS) + 1)
        tl.store(received + peer * PROGRAMS, tl.load(received + peer * PROGRAMS) + 1)


def packs(packing: bool | None, element_size: int, numel: int) -> bool:
    """Whether ll packs two elements a word in a message of ``numel`` elements of ``element_size`` bytes under
    IRIS_LL_PACK's setting ``packing`` (:func:`iris.config.ll_pack`: True, False, None where unset): 16-bit
    elements only, always where on, past LL_UNPACKED elements where unset."""
    return element_size == 2 and (packing is True or (packing is None and numel > LL_UNPACKED))


def ll_pack(element_size: int, numel: int) -> int:
    """Elements per ll word for a message of ``numel`` elements of ``element_size`` bytes here: two where
    :func:`packs`, else one (the word's other half is the push's number)."""
    return 2 if packs(config.ll_pack(), element_size, numel) else 1


def ll_elements(element_size: int) -> int:
    """The most elements of ``element_size`` bytes an ll message holds per rank: LL_WORDS words of two 16-bit
    elements (IRIS_LL_PACK on or unset) or of one 32-bit element (on); else LL_UNPACKED."""
    packing = config.ll_pack()
    if packs(packing, element_size, 2 * LL_WORDS):  # a message this large goes two elements a word
        return 2 * LL_WORDS
    return LL_WORDS if packing else LL_UNPACKED


def holds(variant: str, numel: int, element_size: int) -> bool:
    """Whether a message of ``numel`` elements of ``element_size`` bytes fits the landing zones of
    ``variant`` ("push": PUSH_BYTES per rank, "ll": :func:`ll_elements`; any other variant has none)."""
    if variant == "push":
        return numel * element_size <= PUSH_BYTES
    return variant != "ll" or numel <= ll_elements(element_size)


def capacity(variant: str, element_size: int) -> str:
    """What the landing zones of ``variant`` ("push" or "ll") hold per rank, in its unit: "262144 bytes",
    "262144 elements of 2 bytes"."""
    if variant == "push":
        return f"{PUSH_BYTES} bytes"
    return f"{ll_elements(element_size)} elements of {element_size} bytes"


def check_capacity(variant: str, input) -> None:
    """A message larger than ``variant``'s landing zones is refused before any launch."""
    if not holds(variant, input.numel(), input.element_size()):
        got = f"{input.nbytes} bytes" if variant == "push" else f"{input.numel()} elements"
        raise ValueError(f"all_reduce: the {variant} variant holds at most {capacity(variant, input.element_size())} "
                         f"per rank in its landing zones, got {got}; use one_shot or two_shot for larger messages")


def launch_shape(words: int, block_size: int, ll: bool, interpreted: bool) -> tuple[int, int]:
    """``(block, programs)`` of a push (``ll``: an ll) launch for a message of ``words`` (elements, or ll words).

    Both variants count their pushes per program and reuse each landing half every other count, so every
    program must count every call: if one sat out a call, its count fell behind, a word could land in the same
    half in two calls in a row under two programs, and a fast member's next call overwrote a word a slow member
    still read (4 simulated ranks on one H200 got 34 wrong ll results in 3000 soak calls when the grid shrank for
    small messages). So the grid never depends on the message: on a GPU PUSH_PROGRAMS programs, a program without
    blocks only counting the call; under Triton's interpreter one (it runs programs one after another, where more
    only cost time). The block spreads the message over the programs: from ``block_size`` (ll on a GPU: LL_BLOCK
    words, so that small messages fill the programs) up to the power of two that gives each program one block
    (the interpreter keeps ``block_size``).

    Example:
        >>> launch_shape(8192, 1024, ll=True, interpreted=False)   # 16 KiB of bf16: 128 programs of 64 words
        (64, 128)
        >>> launch_shape(1 << 17, 1024, ll=True, interpreted=False)  # 512 KiB packed: 128 programs of 1024 words
        (1024, 128)
    """
    if interpreted:
        return block_size, 1
    smallest = LL_BLOCK if ll else block_size
    return max(smallest, triton.next_power_of_2(triton.cdiv(words, PUSH_PROGRAMS))), PUSH_PROGRAMS


def launch(ctx, output, input, members, op: str, acc, block_size: int, ll: bool = False):
    """Launch the push (``ll``: the ll) all_reduce of ``input`` into ``output`` on the current stream; returns
    the bound launches."""
    team = ctx.team
    world = ctx.get_num_ranks()
    if ll:  # blocks of words, ll_pack elements each
        pack = ll_pack(input.element_size(), input.numel())
        kernel, buffers, extra = _all_reduce_ll_kernel, (team.ll_landing, team.ll_counts), {"PACK": pack}
    else:
        pack = 1
        kernel, buffers, extra = _all_reduce_push_kernel, (team.push_landing.view(input.dtype), team.push_flags,
                                                           team.push_counts), {}
    words = triton.cdiv(input.numel(), pack)
    block, programs = launch_shape(words, block_size, ll, ctx.backend.interpreted)
    blocks = triton.cdiv(words, block)
    bound = bind(kernel, (programs,), input, output, input.numel(), blocks, members.tensor, members.size,
                 members.index, ctx.get_rank(), ctx.get_heap_bases(), *buffers, WORLD=world, PROGRAMS=PUSH_PROGRAMS,
                 CAPACITY=buffers[0].numel() // (2 * world), OP=op, ACC=acc, BLOCK=block,
                 TRACE=ctx.tracing.enabled, **extra)
    bound()
    team.diagnose_now_in_debug()
    return [bound]
