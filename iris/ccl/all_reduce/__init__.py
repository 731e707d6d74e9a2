"""all_reduce: every member's output is the elementwise SUM (MAX, MIN) of all members' inputs.

Variants (``Config.all_reduce_variant``):
- one_shot: each member reads every member's whole input and reduces it; one pass, W reads of
  everything per rank: the fastest for small messages.
- two_shot: member i reduces slice i of the elements (reading it from every member) and writes
  the result into every member's output: each element is read W times and written W times in
  total, not per rank: the better choice for large messages. With two members, a separate output and
  past ``Config.fused_bytes`` (at any size for members on two nodes), each member first writes the other's half
  into the other's output, then combines its own half there (writes keep the link's rate both ways; see
  :func:`writes_halves`).
- atomic: each member starts its output from its own input, then atomically adds (max, min)
  its input into every other member's output. float32 and int32 for MAX and MIN; SUM also
  float16 and bfloat16 where the backend's atomics allow (see iris.runtime.capabilities).
- spinlock: as atomic, but each update is a plain read-modify-write of a block under a lock
  word of that block on the receiving member: any dtype and op.
- push: no barrier; each member pushes its input into every other member's landing zone (in the
  heap's reserved tail) and sums its own input and what landed, in member order: one exchange of
  flags per call instead of two barriers, for messages up to 1 MiB per rank; in place too. See
  :mod:`iris.ccl.all_reduce.push`.
- ll: push's low-latency form (as NCCL's LL protocol): each element lands beside the push's number in
  one 8-byte word, and a member sums a block as soon as its words carry the number: no flags, no fence;
  for messages up to 32768 elements per rank (262144 of 16 bits, two a word); in place too (same module).
- hierarchical: reduce-scatter inside each node, all_reduce of each member's slice across nodes,
  all_gather inside the node (:mod:`iris.ccl.all_reduce.hierarchical`): the network carries 1 / G of
  the data with G members per node. The default for members on several nodes with as many members
  on each (more than one); any grouping can be given as ``Config.hierarchy``.
- ring: the members pass chunks around the ring (index i sends to i + 1) in W - 1 reduce steps
  and W - 1 gather steps, each a store into the neighbour's output and a flag; every member
  reads only its own memory and writes only its right neighbour's.

atomic, spinlock and ring always run fused and not in place (atomic and spinlock programs seed
their own output before entering the barrier; a ring program waits for its left neighbour).
atomic and spinlock round in the output's dtype in whatever order members' updates land, ring in
ring order: float results may differ between members in the last bit once more than two add.

one_shot and two_shot sum in float32 (int32 for int32) in an order fixed for each block (one_shot:
member order, on every member; two_shot: from the block's owner on, on the owner alone), so every
member gets the same bits.
Up to ``Config.fused_bytes`` per rank (4 MiB) either runs as one launch with the
group's barriers inside (see :func:`iris.ccl._common.run`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from iris.device import atomics, rma, sync, tracing
from iris.ccl import _common, hierarchy
from iris.ccl.all_reduce import hierarchical as all_reduce_hierarchical
from iris.ccl.all_reduce import push as all_reduce_push
from iris.ccl.all_reduce import tuned
from iris.ccl.all_gather import store_to_members
from iris.ccl.reduction import combine, reduce_block
from iris.host.team import LOCK_WORDS
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes
from iris.ccl.config import Config, ReduceOp
from iris.runtime.capabilities import find_limitation
from iris.config import two_shot_writes

# The dtype names of benchmarks/ccl.py, which keys the tuned table by them.
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "int32"}
ELEMENT_SIZES = {name: dtype.itemsize for dtype, name in DTYPE_NAMES.items()}
# Variants whose programs synchronize inside the kernel (seeding before the barrier, ring flags).
FUSED_ONLY = ("atomic", "spinlock", "ring")
# Variants that may write their output over their input (no other member reads it after the write).
IN_PLACE = ("two_shot", "push", "ll", "hierarchical")
# Variants that write only this member's output (it need not be on the heap).
LOCAL_OUTPUT = ("one_shot", "push", "ll")
# Variants with their own kernel and landing zones in the heap's reserved tail (iris.ccl.all_reduce.push); they
# read the input only on its own member, so it need not be on the heap (see input_on_heap).
BARRIER_FREE = ("push", "ll")
# Members on several nodes (each access to a rank on another node one of the transport's device calls) take ll by
# default wherever it holds the message: on 2 x H200 with the shmem heap and IRIS_NODE_MAP=0,1, ll took 5.7-12.1 us
# at 64-512 KiB against push's 11.9-22.7 (the tuned table's choice from 512 KiB on one node) and two_shot's 17.7-35.6.
# Variants refused for members on several nodes (there every access to a rank on another node is one of the
# transport's device calls: NVSHMEM's), with why: on 2 x H200 with the shmem heap and IRIS_NODE_MAP=0,1 each took
# more than 10x the default's time (benchmarks/ccl.py).
FAR_PATH_REFUSED = {
    "atomic": "one remote atomic per element: 300-6000x the default's time at 1 KiB-16 MiB",
    "spinlock": "a remote lock and element-wise remote reads and writes per tile: 12-13x the default's time at "
                "8-16 MiB",
    "ring": "a flag round trip to the next member per block and step: 3-11x the default's time at 1-16 MiB "
            "(11.2x at 16 MiB, 820 us against 73)",
}


@triton.jit
def _one_shot_piece(pid, src, dst, numel, members, count, cur, heap_bases, OP: tl.constexpr, ACC: tl.constexpr,
                    BLOCK: tl.constexpr):
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = reduce_block(src, offs, mask, members, count, 0, cur, heap_bases, OP, ACC)
    tl.store(dst + offs, acc.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _two_shot_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, OP: tl.constexpr,
                    ACC: tl.constexpr, BLOCK: tl.constexpr):
    # This member's slice: blocks index, index + count, ... of the flat tensor.
    offs = (tl.cast(pid, tl.int64) * count + index) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = reduce_block(src, offs, mask, members, count, index, cur, heap_bases, OP, ACC).to(dst.dtype.element_ty)
    store_to_members(dst + offs, acc, members, count, index, cur, heap_bases, mask, 0)


@triton.jit
def _write_half_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, BLOCK: tl.constexpr):
    """two_shot by writes (two members), first kernel: block ``pid`` of the other member's half of this member's
    input (its blocks other, other + 2, ...) into the other's output, where the other sums it with its own."""
    other = (index + 1) % count
    offs = (tl.cast(pid, tl.int64) * count + other) * BLOCK + tl.arange(0, BLOCK)
    rma.put(src + offs, dst + offs, cur, tl.load(members + other), heap_bases, mask=offs < numel)


@triton.jit
def _sum_written_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, OP: tl.constexpr,
                       ACC: tl.constexpr, BLOCK: tl.constexpr):
    """two_shot by writes, second kernel: block ``pid`` of this member's half, its own input combined with what
    the other wrote into its output (the order two_shot's reads take: its own first), into both outputs."""
    offs = (tl.cast(pid, tl.int64) * count + index) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    acc = combine(tl.load(src + offs, mask=mask).to(ACC), tl.load(dst + offs, mask=mask).to(ACC), OP)
    store_to_members(dst + offs, acc.to(dst.dtype.element_ty), members, count, index, cur, heap_bases, mask, 0)


@triton.jit
def _seed_piece(pid, src, dst, numel, BLOCK: tl.constexpr):
    """atomic, spinlock: this member's own input is where its output starts."""
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


@triton.jit
def _accumulate_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, locks, SPINLOCK: tl.constexpr,
                      OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """atomic, spinlock: combine this member's block into every other member's output."""
    offs = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < numel
    x = tl.load(src + offs, mask=mask)
    for i in range(1, count):
        peer = tl.load(members + (index + i) % count)  # start at a different peer on every rank
        if SPINLOCK:
            lock = locks + tl.cast(pid, tl.int64) % LOCK_WORDS
            while atomics.atomic_cas(lock, 0, 1, cur, peer, heap_bases, sem="acquire", scope="sys") != 0:
                pass
            tl.debug_barrier()  # the acquire before any thread reads the block
            theirs = rma.load(dst + offs, cur, peer, heap_bases, mask=mask, volatile=True)
            combined = combine(theirs.to(ACC), x.to(ACC), OP).to(dst.dtype.element_ty)
            rma.store(dst + offs, combined, cur, peer, heap_bases, mask=mask)
            tl.debug_barrier()  # every thread's store before the release
            atomics.atomic_xchg(lock, 0, cur, peer, heap_bases, sem="release", scope="sys")
        elif OP == "sum":
            atomics.atomic_add(dst + offs, x, cur, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
        elif OP == "max":
            atomics.atomic_max(dst + offs, x, cur, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")
        else:
            atomics.atomic_min(dst + offs, x, cur, peer, heap_bases, mask=mask, sem="relaxed", scope="sys")


@triton.jit
def _ring_piece(pid, src, dst, numel, chunk, members, count, index, cur, heap_bases, flags, seen,
                OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    """ring: block ``pid`` of every chunk through the reduce and gather steps; returns the flag count seen.

    Chunk c is elements [c * chunk, (c + 1) * chunk). After reduce step s a member holds chunk
    (index - s - 1) summed over s + 2 members; after the last, chunk (index + 1) is complete and
    the gather steps pass the complete chunks on. Each step stores into the right neighbour's
    output, then adds 1 to its flag (release); a member waits for its own flag (acquire) to
    count one more before it reads what its left neighbour stored. In a job across nodes (the engine
    path) each step's store is a block put from memory: the input at step 0, later this member's own
    copy of the chunk, stored back as read first (no member writes that chunk here again before this
    step has sent it: every later write of it comes around the ring after this member's signal).
    """
    right = tl.load(members + (index + 1) % count)
    within = tl.cast(pid, tl.int64) * BLOCK + tl.arange(0, BLOCK)
    flag = flags + tl.program_id(0)  # this program's counter, the same word on every member
    if count == 1:  # a group of one: no steps, the sum is the input
        tl.store(dst + within, tl.load(src + within, mask=within < numel), mask=within < numel)
    for step in range(0, 2 * count - 2):
        if step < count - 1:
            c = (index - step + count) % count  # reduce steps: the partial sum of chunk index - step
        else:
            c = (index + 1 - (step - (count - 1)) + 2 * count) % count  # gather steps: complete chunks
        offs = c * chunk + within
        mask = (within < chunk) & (offs < numel)
        if rma.ENGINE:  # toward another node a block put, from memory (see store_to_members)
            if step == 0:
                rma.put(src + offs, dst + offs, cur, right, heap_bases, mask=mask)
            else:  # stored back as read (volatile), so the put's own reads of it see those values
                tl.store(dst + offs, tl.load(dst + offs, mask=mask, volatile=True), mask=mask)
                rma.put(dst + offs, dst + offs, cur, right, heap_bases, mask=mask)
        else:
            if step == 0:
                out = tl.load(src + offs, mask=mask)
            else:
                out = tl.load(dst + offs, mask=mask, volatile=True)  # computed here, or stored by the left neighbour
            rma.store(dst + offs, out, cur, right, heap_bases, mask=mask)
        tl.debug_barrier()  # every thread's store before the flag
        sync.signal(flag, 1, cur, right, heap_bases, op="add")
        seen += 1
        sync.wait_until(flag, ">=", seen)
        tl.debug_barrier()  # the acquire before any thread reads what arrived
        if step < count - 1:  # arrived: chunk c - 1 summed over step + 1 members; add this member's part
            offs = ((c - 1 + count) % count) * chunk + within
            mask = (within < chunk) & (offs < numel)
            theirs = tl.load(dst + offs, mask=mask, volatile=True).to(ACC)
            mine = tl.load(src + offs, mask=mask).to(ACC)
            tl.store(dst + offs, combine(theirs, mine, OP).to(dst.dtype.element_ty), mask=mask)
    return seen


@triton.jit
def _all_reduce_piece(pid, trace, src, dst, numel, members, count, index, cur, heap_bases, locks,
                      VARIANT: tl.constexpr, OP: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr):
    span = trace.start(tracing.REDUCE, cur, -1, src, pid, -1, elements_bytes(src, count * BLOCK))
    if VARIANT == "two_shot":
        _two_shot_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, OP, ACC, BLOCK)
    elif VARIANT == "one_shot":
        _one_shot_piece(pid, src, dst, numel, members, count, cur, heap_bases, OP, ACC, BLOCK)
    elif VARIANT == "write_halves":  # two_shot by writes (see all_reduce), first kernel
        _write_half_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, BLOCK)
    elif VARIANT == "sum_written":  # and second
        _sum_written_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, OP, ACC, BLOCK)
    elif (VARIANT == "atomic") or (VARIANT == "spinlock"):  # ring runs fused only: see _ring_piece
        _accumulate_piece(pid, src, dst, numel, members, count, index, cur, heap_bases, locks,
                          VARIANT == "spinlock", OP, ACC, BLOCK)
    trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS + ("chunk",))
def _all_reduce_kernel(src, dst, numel, chunk, members, count, index, cur, heap_bases, locks, flags, counts, arrivals,
                       expected, programs, FUSED: tl.constexpr, EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr,
                       BARRIER_BLOCK: tl.constexpr, TRACE: tl.constexpr, VARIANT: tl.constexpr, OP: tl.constexpr,
                       ACC: tl.constexpr, BLOCK: tl.constexpr):
    if (VARIANT == "atomic") or (VARIANT == "spinlock"):  # fused only: seed the output, then enter
        for pid in range(tl.program_id(0), programs, tl.num_programs(0)):
            _seed_piece(pid, src, dst, numel, BLOCK)
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    if VARIANT == "ring":  # fused only
        seen = tl.load(counts + tl.program_id(0))  # this program's flag count before this call
        for pid in range(tl.program_id(0), programs, tl.num_programs(0)):
            span = trace.start(tracing.REDUCE, cur, -1, dst, pid, -1, elements_bytes(dst, count * BLOCK))
            seen = _ring_piece(pid, src, dst, numel, chunk, members, count, index, cur, heap_bases, flags, seen,
                               OP, ACC, BLOCK)
            trace.end(span)
        tl.store(counts + tl.program_id(0), seen)
    else:
        for pid in range(tl.program_id(0), programs, tl.num_programs(0)):  # skeleton: iris.device.barrier
            _all_reduce_piece(pid, trace, src, dst, numel, members, count, index, cur, heap_bases, locks, VARIANT,
                              OP, ACC, BLOCK)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def choose_variant(nbytes: int, in_place: bool, world_size: int, dtype=torch.bfloat16) -> str:
    """The default variant for ``nbytes`` per rank of ``dtype`` among ``world_size`` members.

    The entry of :data:`iris.ccl.all_reduce.tuned.ALL_REDUCE` for the world size and dtype (a dtype not tuned
    takes the table of one that is): that table is written by ``benchmarks/ccl.py --tune`` from
    the committed runs, not by hand. In place, where the entry is one_shot: two_shot (one_shot would
    overwrite what other members still read; push, ll and two_shot run in place). Past the landing
    zones of a push or ll entry: the next entry's variant. Past its entries and for world sizes not
    measured: two_shot, whose traffic per member stays under twice the data while one_shot's grows
    with the members.

    Example:
        >>> choose_variant(1024, in_place=False, world_size=8, dtype=torch.bfloat16)
        'one_shot'
    """
    name = DTYPE_NAMES.get(dtype, dtype)
    table = tuned.ALL_REDUCE.get((world_size, name))
    if table is None:  # not tuned for this dtype: the first tuned dtype's table at this world size
        table = next((entries for (world, _), entries in tuned.ALL_REDUCE.items() if world == world_size), ())
    element_size = ELEMENT_SIZES.get(name, 1)
    # the first entry whose range takes this size and whose variant holds it (a range measured past a
    # push or ll landing zone gives way to the next entry there)
    variant = next((variant for below, variant in table
                    if nbytes < below and all_reduce_push.holds(variant, nbytes // element_size, element_size)),
                   "two_shot")
    return variant if variant in IN_PLACE or not in_place else "two_shot"


@functools.lru_cache(maxsize=256)
def _local_output_config(nbytes: int, world_size: int, dtype) -> Config | None:
    variant = choose_variant(nbytes, False, world_size, dtype)
    return Config(all_reduce_variant=variant) if variant in LOCAL_OUTPUT else None


def all_reduce_to_new(tensor, ctx, stage, op=ReduceOp.SUM, group=None) -> torch.Tensor:
    """The all-reduce of ``tensor`` (contiguous, on this rank's device) as a new tensor, ``tensor`` left as it
    was, the way an out-of-place API needs it. ``stage(tensor)`` copies it into a heap buffer made once and
    returns that copy. Where the variant chosen for its size writes only this rank's output (one_shot, push,
    ll: the small sizes), the result goes straight into ``torch.empty_like(tensor)``, read from ``tensor`` where
    it is if the variant reads its input only here (push, ll: see :func:`input_on_heap`: no copy at all), else
    from ``stage(tensor)``; at larger sizes the all-reduce runs in place in ``stage(tensor)``, then is cloned.
    Nothing is allocated on the heap, so a CUDA graph can capture the call.

    Example:
        >>> buffer = ctx.empty(16, 4096, dtype=torch.bfloat16)   # made once
        >>> out = all_reduce_to_new(x, ctx, stage=buffer.copy_)
    """
    world_size = ctx.get_num_ranks() if group is None else torch.distributed.get_world_size(group)
    config = _local_output_config(tensor.numel() * tensor.element_size(), world_size, tensor.dtype)
    if config is not None:
        out = torch.empty_like(tensor)
        engine = ctx.team.heap_reaches_by_engine
        source = stage(tensor) if input_on_heap(config.all_reduce_variant, engine) else tensor
        ctx.ccl.all_reduce(out, source, op=op, group=group, config=config)
        return out
    staged = stage(tensor)
    ctx.ccl.all_reduce(staged, staged, op=op, group=group)
    return staged.clone()


class AllReduceWorkspace:
    """What all_reduce_preamble prepares: the resolved variant, the group and its members, and for the
    hierarchical variant this member's node team and cross team (no memory: the collectives' state
    lives in the heap's reserved regions, see iris.host.team)."""

    def __init__(self, variant: str, group, members, teams=None, across_nodes: bool = False):
        self.variant = variant
        self.group = group
        self.members = members
        self.teams = teams
        self.across_nodes = across_nodes


def _check_atomic(ctx, dtype, op) -> None:
    """The atomic variant needs the backend's atomics for ``dtype`` and ``op`` (errors before any launch)."""
    if op is not ReduceOp.SUM and dtype not in (torch.float32, torch.int32):
        raise TypeError(f"all_reduce: the atomic variant does {op.name} on float32 and int32 only, not "
                        f"{str(dtype).removeprefix('torch.')}; use another variant")
    row = find_limitation(ctx.backend.name, "atomic", dtype, concurrent=True)
    if row is not None:
        raise TypeError(f"all_reduce: the atomic variant cannot add {row.dtype} on the {row.backend} backend: "
                        f"{row.reason}; use another variant")


def far_path_refusal(variant: str, across_nodes: bool) -> str | None:
    """Why ``variant`` is refused for members on several nodes (``across_nodes``), or None where it runs.

    Example:
        >>> far_path_refusal("atomic", across_nodes=False) is None and far_path_refusal("ll", True) is None
        True
    """
    if not across_nodes or variant not in FAR_PATH_REFUSED:
        return None
    return (f"all_reduce: the {variant} variant is refused for members on several nodes (each access to another "
            f"node one of the transport's device calls): {FAR_PATH_REFUSED[variant]}; leave all_reduce_variant "
            "unset (the default) or use two_shot")


def input_on_heap(variant: str, engine: bool) -> bool:
    """Whether ``variant`` needs its input on the symmetric heap: every variant whose peers read it, and push
    where the heap may reach a rank by the engine (its block put toward another node reads the input as the
    source of a transfer, which the transport must reach). ll's words are made in registers, push's blocks
    are stored by this member's own threads: their input may be anywhere on the device, so a tensor off the
    heap needs no copy into one. ``engine``: the heap may reach a rank by the engine
    (``ctx.team.heap_reaches_by_engine``)."""
    return variant not in BARRIER_FREE or (variant == "push" and engine)


def all_reduce_preamble(output, input, ctx, config=None, workspace=None, group=None):
    """Check the tensors and resolve the variant once; pass the result as ``workspace=`` to reuse it."""
    config = _common.config_or_default(config)
    what = "all_reduce"
    ctx.team.check_tensor(what, "input", input, _common.REDUCE_DTYPES, symmetric=False)
    if output.shape != input.shape or output.dtype != input.dtype:
        raise ValueError(f"{what}: output must match input's shape and dtype; got output {tuple(output.shape)} "
                         f"{output.dtype}, input {tuple(input.shape)} {input.dtype}")
    if workspace is not None:
        group = workspace.group
    members = ctx.team.participants(group)
    in_place = input.numel() > 0 and output.data_ptr() == input.data_ptr()
    nodes = hierarchy.nodes_of_members(ctx, config, members, what)
    variant = config.all_reduce_variant
    across_nodes = len(set(nodes)) > 1
    if variant is None:
        if hierarchy.pays(nodes):
            variant = "hierarchical"
        elif across_nodes and all_reduce_push.holds("ll", input.numel(), input.element_size()):
            variant = "ll"  # see the note above FAR_PATH_REFUSED
        else:
            variant = choose_variant(input.nbytes, in_place, members.size, input.dtype)
    refusal = far_path_refusal(variant, across_nodes)
    if refusal is not None:
        raise ValueError(refusal)
    if in_place and variant not in IN_PLACE:
        raise ValueError(f"all_reduce: {variant} cannot run in place (other members still read input while it "
                         "would be overwritten); use Config(all_reduce_variant=\"two_shot\") or a separate output")
    if variant in BARRIER_FREE:
        all_reduce_push.check_capacity(variant, input)
    on_heap = input_on_heap(variant, ctx.team.heap_reaches_by_engine)
    ctx.team.check_tensor(what, "input", input, _common.REDUCE_DTYPES, symmetric=on_heap)
    ctx.team.check_tensor(what, "output", output, _common.REDUCE_DTYPES, symmetric=variant not in LOCAL_OUTPUT)
    teams = None
    if variant == "hierarchical":
        teams = hierarchy.teams(members.ranks, nodes, ctx.get_rank())
    return AllReduceWorkspace(variant, group, members, teams, across_nodes)


def all_reduce(output, input, ctx, op=ReduceOp.SUM, group=None, async_op=False, config=None, workspace=None):
    """``output = op(input of every member)``, elementwise, on every member.

    Args:
        output: the result, shape and dtype of ``input``; on the symmetric heap for two_shot.
            May be ``input`` itself (in place).
        input: on the symmetric heap (the other members read it).
        ctx: the Iris context.
        op: ReduceOp.SUM (default), MAX or MIN.
        group, async_op: as for :func:`iris.ccl.all_gather.all_gather`. With async_op=True,
            barrier before changing ``input`` again: the other members may still read it.
        config: an :class:`iris.ccl.Config` (``all_reduce_variant``, ``block_size``).
        workspace: from :func:`all_reduce_preamble`, to skip the checks on repeated calls.

    Example:
        >>> x = ctx.ones(1 << 20, dtype=torch.bfloat16)
        >>> ctx.ccl.all_reduce(x, x)          # in place: x == world size everywhere
    """
    op = ReduceOp(op) if not isinstance(op, ReduceOp) else op
    config = _common.config_or_default(config)
    if workspace is None:
        workspace = all_reduce_preamble(output, input, ctx, config, group=group)
    elif group is not None and group is not workspace.group:
        raise ValueError("all_reduce: the workspace was prepared for another group; prepare one per group")
    group = workspace.group
    members = workspace.members
    numel = input.numel()
    blocks = triton.cdiv(numel, config.block_size)
    variant = workspace.variant
    acc = tl.float32 if input.dtype.is_floating_point else tl.int32
    if variant == "hierarchical":  # other collectives over the node and cross teams
        return all_reduce_hierarchical.launch(ctx, output, input, op, config, group, *workspace.teams, async_op,
                                              flat_all_reduce=all_reduce)
    if variant in BARRIER_FREE:  # their own kernels: no barrier to fuse or not
        return all_reduce_push.launch(ctx, output, input, members, op.value, acc, config.block_size,
                                      ll=variant == "ll")
    if variant == "atomic":
        _check_atomic(ctx, input.dtype, op)
    fuse = variant in FUSED_ONLY or _common.fuse(config, input.nbytes)
    chunk = triton.cdiv(numel, members.size)  # ring: each member's share
    if variant == "ring":
        pieces = triton.cdiv(chunk, config.block_size)
    elif variant == "two_shot":
        pieces = triton.cdiv(blocks, members.size)
    else:
        pieces = blocks
    team = ctx.team
    args = (input, output, numel, chunk, members.tensor, members.size, members.index, ctx.get_rank(),
            ctx.get_heap_bases(), team.lock_words, team.ring_flags, team.ring_counts)
    if variant == "two_shot" and writes_halves(members.size, output.data_ptr() == input.data_ptr(), fuse,
                                               workspace.across_nodes):
        # no barrier after the writes' kernel: the sums' launch starts with one
        return (_common.run(ctx, group, True, False, _all_reduce_kernel, pieces, *args, VARIANT="write_halves",
                            OP=op.value, ACC=acc, BLOCK=config.block_size)
                + _common.run(ctx, group, async_op, False, _all_reduce_kernel, pieces, *args, VARIANT="sum_written",
                              OP=op.value, ACC=acc, BLOCK=config.block_size))
    return _common.run(ctx, group, async_op, fuse, _all_reduce_kernel, pieces, *args, VARIANT=variant, OP=op.value,
                       ACC=acc, BLOCK=config.block_size)


def writes_halves(members: int, in_place: bool, fused: bool, across_nodes: bool = False) -> bool:
    """Whether two_shot moves the halves by writes: two members, a separate output, three launches (past
    ``Config.fused_bytes``, or at any size for members on two nodes: there the fused launch's reads go through the
    transport, and on 2 x H200 with the shmem heap and IRIS_NODE_MAP=0,1 two_shot by writes took 25.4, 27.4, 31.2
    and 37.0 us at 512 KiB, 1, 2 and 4 MiB against 35.6, 41.9, 54.4 and 78.8 fused) and IRIS_TWO_SHOT_WRITES on
    (the default). Each member first writes the half of its input that the other reduces into the other's output
    (a barrier), then combines its own half with what landed there and writes the result into both outputs (a
    barrier). The traffic is two_shot's, but all of it writes: on 2 x H200 the link carried 128 MiB each way at
    once in 370 us by SM stores and 404 us by SM loads (benchmarks/probes/bidirectional_probe.py). In place the
    first writes would overwrite the other's input before it is read; with more members the other members' halves
    have no place to land.

    Example:
        >>> writes_halves(4, in_place=False, fused=False)
        False
    """
    return members == 2 and not in_place and (across_nodes or not fused) and two_shot_writes()
