"""all_reduce's push and ll variants: one launch, no barrier; each member pushes its input into every other
member's landing zone, then sums its own input and what landed, in member order.

Where a barrier variant spends two device barriers per call, program p of each member stores its blocks
into every peer's zone and sets a flag there (release), waits for every peer's program p (acquire), and
sums: one exchange of flags, nothing for the host to wait for (a CUDA graph can replay it). The zones are
double-buffered and counted per pair of members and program (push n lands in half n % 2 with flag n + 1),
so members that also meet in other groups stay in step. A call that fails part-way on one member leaves
that pair's counts apart (later calls wait; debug mode's waits raise :class:`iris.WaitTimeoutError`): make
a new context. A message is at most PUSH_BYTES per rank (the zones: :data:`REGIONS`).

ll (low latency, as NCCL's LL protocol) drops the flags: each 8-byte word carries data in its low half and
the push's number in its high half; a reader spins on the words (:func:`iris.device.sync.wait_flagged_words`)
and sums a block once its words carry the number. A word holds one element, or two 16-bit ones past
LL_UNPACKED elements (IRIS_LL_PACK: :func:`ll_pack`, :func:`holds`). Toward another node each word goes as one
8-byte put of the engine. ll's landing words and counts are its own (a push leaves raw data in its zones).

Example:
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="push"))
    >>> ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="ll"))
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from iris import config
from iris.ccl.all_reduce.kernel import accumulator
from iris.ccl.all_reduce.variant import Variant
from iris.ccl.reduction import combine
from iris.device import rma, sync, tracing
from iris.device.barrier import GROUP_ARGS
from iris.device.tracing import elements_bytes, tracing_from_context
from iris.host.replay import bind
from iris.memory.reserved import Region, declare

# push: the largest message (bytes per rank), and the most programs of one call (each with its own flags and
# counts per peer); 128 programs with 1 MiB zones kept push ahead of a two_shot up to 1 MiB where fewer programs
# fell behind (docs/benchmarks.md). The zones cost 2 x world MiB of each rank's heap tail, as ll's do.
PUSH_BYTES = 1 << 20
PUSH_PROGRAMS = 128
# ll: the most 8-byte words of a message, each carrying the push's number beside one element (or two of 16 bits
# with IRIS_LL_PACK: 512 KiB of bfloat16); with IRIS_LL_PACK off at most LL_UNPACKED elements.
LL_WORDS = 128 << 10
LL_UNPACKED = 32 << 10
# The smallest block (words) of an ll launch on a GPU (see launch_shape): small, so that small messages fill the
# programs (a decode step's all_reduce runs faster in many small blocks than in a few large ones).
LL_BLOCK = 64

# [half][sender] landing zones and flags per program on the heap; local counts [sent | received][rank][program].
# ll's landing words and counts are its own: its flags live in the words, so a word a push call left (raw data)
# must never be read as one of its words; flag 0 (zeroed) is never a push's number.
REGIONS = declare(
    Region("ccl.push_landing", 2 * PUSH_BYTES // 8, torch.int64, order=30, per_rank=True, lifetime="call"),
    Region("ccl.push_flags", 2 * PUSH_PROGRAMS, torch.int32, order=40, per_rank=True),
    Region("ccl.ll_landing", 2 * LL_WORDS, torch.int64, order=50, per_rank=True),
    Region("ccl.push_counts", 2 * PUSH_PROGRAMS, torch.int32, per_rank=True, on_heap=False),
    Region("ccl.ll_counts", 2 * PUSH_PROGRAMS, torch.int32, per_rank=True, on_heap=False),
)


@triton.jit
def _slot(base, count_word, rank, WORLD: tl.constexpr, SIZE: tl.constexpr):
    """The slot of ``rank`` in the buffer half (count % 2) a push numbered by ``count_word`` uses."""
    return base + ((tl.load(count_word) % 2) * WORLD + rank) * SIZE


@triton.jit
def _member_block(src, landing, received, members, j, cur, offs, mask, WORLD: tl.constexpr, PROGRAMS: tl.constexpr,
                  CAPACITY: tl.constexpr, BLOCK: tl.constexpr):
    """Member ``j``'s block at ``offs``: this member's own from ``src``, a peer's from its slot here. The lanes'
    test is a block, not a scalar: Triton's interpreter refuses a block mask & a scalar bool as a mask."""
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


def launch_shape(words: int, block_size: int, ll: bool, in_turn: bool) -> tuple[int, int]:
    """``(block, programs)`` of a push (``ll``: an ll) launch for a message of ``words`` (elements, or ll words).

    Every program counts every call (one that sat out would fall behind, and a word could land in a half a slow
    member still reads), so the grid never depends on the message: PUSH_PROGRAMS, or one where a launch's
    programs run one after another (``in_turn``: the interpreter). The block spreads the message over them, from
    ``block_size`` (ll on a GPU: LL_BLOCK words) up to one block per program.

    Example:
        >>> launch_shape(8192, 1024, ll=True, in_turn=False)   # 16 KiB of bf16: 128 programs of 64 words
        (64, 128)
        >>> launch_shape(1 << 17, 1024, ll=True, in_turn=False)  # 512 KiB packed: 128 programs of 1024 words
        (1024, 128)
    """
    if in_turn:
        return block_size, 1
    smallest = LL_BLOCK if ll else block_size
    return max(smallest, triton.next_power_of_2(triton.cdiv(words, PUSH_PROGRAMS))), PUSH_PROGRAMS


def _launch(ctx, output, input, op, config, workspace, ll: bool) -> list:
    team, members = ctx.team, workspace.members
    world = ctx.get_num_ranks()
    if ll:  # blocks of words, ll_pack elements each
        pack = ll_pack(input.element_size(), input.numel())
        kernel, buffers, extra = (_all_reduce_ll_kernel, (team.region("ccl.ll_landing"), team.region("ccl.ll_counts")),
                                  {"PACK": pack})
    else:
        pack = 1
        kernel, buffers, extra = _all_reduce_push_kernel, (team.region("ccl.push_landing").view(input.dtype),
                                                           team.region("ccl.push_flags"),
                                                           team.region("ccl.push_counts")), {}
    words = triton.cdiv(input.numel(), pack)
    block, programs = launch_shape(words, config.block_size, ll, ctx.backend.runs_programs_in_turn)
    blocks = triton.cdiv(words, block)
    bound = bind(kernel, (programs,), input, output, input.numel(), blocks, members.tensor, members.size,
                 members.index, ctx.get_rank(), ctx.get_heap_bases(), *buffers, WORLD=world, PROGRAMS=PUSH_PROGRAMS,
                 CAPACITY=buffers[0].numel() // (2 * world), OP=op.value, ACC=accumulator(input.dtype), BLOCK=block,
                 TRACE=ctx.tracing.enabled, **extra)
    bound()
    team.diagnose_now_in_debug()
    return [bound]


def launch_push(ctx, output, input, op, config, workspace, async_op: bool) -> list:
    return _launch(ctx, output, input, op, config, workspace, ll=False)


def launch_ll(ctx, output, input, op, config, workspace, async_op: bool) -> list:
    return _launch(ctx, output, input, op, config, workspace, ll=True)


# Neither has a barrier (async_op changes nothing); both read the input only here (push's block put toward another
# node reads it as a transfer's source: on the heap where the heap may reach a rank by the engine).
PUSH = Variant("push", launch_push, in_place=True, local_output=True, barrier_free=True, peers_read_input=False,
               engine_reads_input=True, check=functools.partial(check_capacity, "push"))
LL = Variant("ll", launch_ll, in_place=True, local_output=True, barrier_free=True, peers_read_input=False,
             check=functools.partial(check_capacity, "ll"))
