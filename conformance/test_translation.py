"""Translation: load/store/get/put/copy move exactly the right bytes, from and to anywhere in the heap.

Each case fills every rank's whole heap with random bytes, writes source values
at one offset, runs one operation from one rank, and then compares every byte
of every heap with the expectation: the destination lanes the mask selects hold
the source's bytes, masked-out lanes keep their poison (or get ``other``), and
no other byte of any heap changes. Destinations may end at the heap's last byte.
"""

import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import iris
from conformance import harness
from conformance.dtypes import LOAD_STORE_DTYPES, element_size, values
from conformance.profiles import current

# load and get also as code written for the original calls them (its implementation's order: the current
# rank first, then the rank read; its docstrings say the opposite): both orders read the other rank.
OPS = ("load", "store", "get", "put", "copy", "load, current rank first", "get, current rank first")


def _other(dtype: torch.dtype):
    """``other`` for masked loads: 3 is exact in every dtype, fp8 included (and True for bool).

    A float for float dtypes: Triton casts fp8 only from and to floats.
    """
    return 3.0 if dtype.is_floating_point else 3


@harness.jit(aligned=("src", "dst"))  # the alignments the offsets give: vectorized and scalar code both run
def _move_kernel(src, dst, lane_mask, n, cur, peer_a, peer_b, heap_bases, op_id, use_other,
                 OTHER: tl.constexpr, BLOCK: tl.constexpr):
    """OPS[op_id] on one block; ``use_other``: a masked load fills unselected lanes with OTHER."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    mask = inside & (tl.load(lane_mask + offs, mask=inside, other=0) != 0)
    if op_id == 0:  # load
        if use_other:
            data = iris.load(src + offs, cur, peer_a, heap_bases, mask=mask, other=OTHER)
            tl.store(dst + offs, data, mask=inside)
        else:
            tl.store(dst + offs, iris.load(src + offs, cur, peer_a, heap_bases, mask=mask), mask=mask)
    elif op_id == 1:
        iris.store(dst + offs, tl.load(src + offs, mask=mask), cur, peer_a, heap_bases, mask=mask)
    elif op_id == 2:
        iris.get(src + offs, dst + offs, peer_a, cur, heap_bases, mask=mask)
    elif op_id == 3:
        iris.put(src + offs, dst + offs, cur, peer_a, heap_bases, mask=mask)
    elif op_id == 4:
        iris.copy(src + offs, dst + offs, peer_a, peer_b, cur, heap_bases, mask=mask)
    elif op_id == 5:  # load(pointer, to_rank, from_rank) with the current rank as from_rank
        if use_other:
            tl.store(dst + offs, iris.load(src + offs, peer_a, cur, heap_bases, mask=mask, other=OTHER), mask=inside)
        else:
            tl.store(dst + offs, iris.load(src + offs, peer_a, cur, heap_bases, mask=mask), mask=mask)
    else:  # get(from_ptr, to_ptr, from_rank, to_rank) with the current rank as from_rank
        iris.get(src + offs, dst + offs, cur, peer_a, heap_bases, mask=mask)


@st.composite
def move_cases(draw, world_size: int):
    dtype = draw(st.sampled_from(LOAD_STORE_DTYPES))
    op = draw(st.sampled_from(OPS))
    n = draw(st.integers(1, 512))
    size = element_size(dtype)
    nbytes = n * size
    free = harness.HEAP_BYTES - 2 * nbytes
    # Two disjoint regions anywhere in the heap; the destination may end at the heap's last byte.
    first = draw(st.integers(0, free)) // size * size
    gap = free - first if draw(st.booleans()) else draw(st.integers(0, free - first)) // size * size
    dst_last = gap == free - first or draw(st.booleans())
    src_offset, dst_offset = (first, first + nbytes + gap) if dst_last else (first + nbytes + gap, first)
    ranks = st.integers(0, world_size - 1)
    return dict(
        op=op, dtype=dtype, n=n, block=64, src_offset=src_offset,
        dst_offset=dst_offset, actor=draw(ranks), peer_a=draw(ranks), peer_b=draw(ranks),
        mask=draw(st.sampled_from(("all", "none", "random", "prefix"))),
        use_other=op.startswith("load") and draw(st.booleans()), seed=draw(harness.seeds()),
    )


def _lane_mask(kind: str, n: int, seed: int) -> torch.Tensor:
    if kind == "all":
        return torch.ones(n, dtype=torch.int8)
    if kind == "none":
        return torch.zeros(n, dtype=torch.int8)
    if kind == "prefix":
        return (torch.arange(n) < n // 2).to(torch.int8)
    return torch.randint(0, 2, (n,), generator=harness.generator(seed, 0, 3), dtype=torch.int8)


def _roles(case) -> tuple[int, int]:
    """(rank whose source is read, rank whose destination is written)."""
    if case["op"].startswith(("load", "get")):
        return case["peer_a"], case["actor"]
    if case["op"] in ("store", "put"):
        return case["actor"], case["peer_a"]
    return case["peer_a"], case["peer_b"]


def _source_values(case, rank: int) -> torch.Tensor:
    return values(case["dtype"], case["n"], harness.generator(case["seed"], rank, 2))


def _move_on_rank(case):
    ctx = harness.context()
    rank, dtype, n = ctx.get_rank(), case["dtype"], case["n"]
    expected = harness.fill_arena(case["seed"])
    src_bytes = harness.byte_view(_source_values(case, rank))
    harness.arena()[case["src_offset"] : case["src_offset"] + src_bytes.numel()].copy_(src_bytes)
    expected[case["src_offset"] : case["src_offset"] + src_bytes.numel()] = src_bytes
    lane_mask = _lane_mask(case["mask"], n, case["seed"])
    ctx.barrier()
    violations = []
    if rank == case["actor"]:
        violations = harness.attempt(
            _move_kernel[(triton.cdiv(n, case["block"]),)],
            harness.region(case["src_offset"], n, dtype), harness.region(case["dst_offset"], n, dtype),
            lane_mask.to(ctx.get_device()), n, rank, case["peer_a"], case["peer_b"], ctx.get_heap_bases(),
            OPS.index(case["op"]), int(case["use_other"]), OTHER=_other(dtype), BLOCK=case["block"])
    ctx.barrier()
    source, destination = _roles(case)
    if rank == destination:  # lane by lane, in bytes (a bool view would turn poison bytes into 0/1)
        lanes = expected[case["dst_offset"] : case["dst_offset"] + src_bytes.numel()].view(n, -1)
        selected = lane_mask.bool()
        lanes[selected] = harness.byte_view(_source_values(case, source)).view(n, -1)[selected]
        if case["use_other"]:
            lanes[~selected] = harness.byte_view(torch.full((n,), _other(dtype)).to(dtype)).view(n, -1)[~selected]
    return harness.Verdict(violations + harness.compare_arena(expected))


@settings(max_examples=current().examples(3))
@given(data=st.data())
def test_moves_exact_bytes_anywhere_in_the_heap(world, data):
    """Every op x dtype x offset x mask x rank pair: the selected lanes move, nothing else changes."""
    world.check(_move_on_rank, data.draw(move_cases(world.size), label="case"))


@harness.jit
def _round_trip_kernel(base, index, out, count, cur, rank_a, rank_b, heap_bases, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < count
    ptr = base + tl.load(index + offs, mask=inside, other=0)
    at_a = iris.translate(ptr, cur, rank_a, heap_bases)
    at_b = iris.translate(at_a, rank_a, rank_b, heap_bases)
    back = iris.translate(at_b, rank_b, cur, heap_bases)
    tl.store(out + offs * 3, at_a.to(tl.int64), mask=inside)
    tl.store(out + offs * 3 + 1, at_b.to(tl.int64), mask=inside)
    tl.store(out + offs * 3 + 2, back.to(tl.int64), mask=inside)


def _round_trip_on_rank(case):
    ctx = harness.context()
    rank, dtype = ctx.get_rank(), case["dtype"]
    size = element_size(dtype)
    last = harness.HEAP_BYTES // size - 1
    g = harness.generator(case["seed"], 0, 4)
    index = torch.cat([torch.tensor([0, last]), torch.randint(0, last + 1, (case["count"],), generator=g)])
    out = torch.zeros(index.numel() * 3, dtype=torch.int64, device=ctx.get_device())
    base = harness.region(0, last + 1, dtype)
    _round_trip_kernel[(triton.cdiv(index.numel(), 64),)](base, index.to(ctx.get_device()), out, index.numel(),
                                                         rank, case["rank_a"], case["rank_b"],
                                                         ctx.get_heap_bases(), BLOCK=64)
    bases = ctx.heap.bases
    got = out.cpu().view(-1, 3)
    offsets = index * size
    want = torch.stack([bases[case["rank_a"]] + offsets, bases[case["rank_b"]] + offsets, bases[rank] + offsets], 1)
    bad = (got != want).any(1).nonzero().flatten()
    return harness.Verdict([f"{bad.numel()} of {index.numel()} addresses wrong; first: byte offset "
                            f"{int(offsets[bad[0]])} -> {got[bad[0]].tolist()}, expected {want[bad[0]].tolist()}"]
                           if bad.numel() else [])


@given(data=st.data())
def test_translating_there_and_back_is_the_identity(world, data):
    """cur -> a -> b -> cur returns the pointer, and each hop lands at the same offset of that rank's heap."""
    ranks = st.integers(0, world.size - 1)
    case = data.draw(st.fixed_dictionaries(dict(
        dtype=st.sampled_from(LOAD_STORE_DTYPES), rank_a=ranks, rank_b=ranks, count=st.integers(1, 200),
        seed=harness.seeds())), label="case")
    world.check(_round_trip_on_rank, case)
