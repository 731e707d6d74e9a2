"""Every device function, on 2 and 4 ranks, with exact checks.

Each test sends a module-level function to every rank of the pool; inside it,
each rank builds a context, runs a kernel and checks every element: moved data
must equal the source, and masked-out lanes must keep their poison value.
"""

import pytest
import torch
import triton
import triton.language as tl

import iris

N = 200  # elements per buffer: several programs of BLOCK, with a ragged tail
BLOCK = 64
POISON = -7


def _data(seed: int, rank: int, dtype=torch.int32, n=N) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randint(-(2**20), 2**20, (n,), generator=g).to(dtype)


@triton.jit
def _rma_kernel(src, dst, n_valid, peer_a, peer_b, rank, heap_bases, OP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_valid
    if OP == "store":
        iris.store(dst + offs, tl.load(src + offs, mask=mask), rank, peer_a, heap_bases, mask=mask)
    elif OP == "load":
        data = iris.load(src + offs, rank, peer_a, heap_bases, mask=mask, other=-7)
        tl.store(dst + offs, data, mask=offs < n_valid + 8)  # lanes past n_valid must hold `other`
    elif OP == "load, ranks as the original's code passes them":  # load(pointer, peer, current)
        data = iris.load(src + offs, peer_a, rank, heap_bases, mask=mask, other=-7)
        tl.store(dst + offs, data, mask=offs < n_valid + 8)
    elif OP == "get":
        iris.get(src + offs, dst + offs, peer_a, rank, heap_bases, mask=mask)
    elif OP == "get, ranks as the original's code passes them":  # get(src, dst, current, peer), and its newest
        iris.get(src + offs, dst + offs, rank, peer_a, heap_bases, mask=mask, load_cache_modifier=".cg",  # keywords
                 store_cache_modifier=".wt")
    elif OP == "put":
        iris.put(src + offs, dst + offs, rank, peer_a, heap_bases, mask=mask)
    elif OP == "copy":
        iris.copy(src + offs, dst + offs, peer_a, peer_b, rank, heap_bases, mask=mask)
    elif OP == "copy, cache modifiers":  # the original's newest keywords: the read's and the write's
        iris.copy(src + offs, dst + offs, peer_a, peer_b, rank, heap_bases, mask=mask, load_cache_modifier=".ca",
                  store_cache_modifier=".wb")


def _rma_on_rank(op: str, seed: int, n_valid: int):
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    nxt, nxt2 = (rank + 1) % world, (rank + 2) % world
    prev = (rank - 1) % world
    src = ctx.as_symmetric(_data(seed, rank))
    dst = ctx.full((N,), POISON, dtype=torch.int32)
    ctx.barrier()
    _rma_kernel[(triton.cdiv(N, BLOCK),)](src, dst, n_valid, nxt, nxt2, rank, ctx.get_heap_bases(), OP=op,
                                          BLOCK=BLOCK)
    ctx.barrier()
    expected = torch.full((N,), POISON, dtype=torch.int32)
    if op.startswith(("store", "put")):  # prev wrote its source into my dst
        expected[:n_valid] = _data(seed, prev)[:n_valid]
    elif op.startswith(("load", "get")):  # I read nxt's source, whatever the order of the two ranks
        expected[:n_valid] = _data(seed, nxt)[:n_valid]
        if op.startswith("load"):
            expected[n_valid : n_valid + 8] = POISON  # `other` is POISON too: loaded masked lanes
    elif op.startswith("copy"):  # rank prev2 moved rank prev's source into my dst (with 2 ranks prev2 is me)
        expected[:n_valid] = _data(seed, prev)[:n_valid]
    got = dst.cpu()
    ctx.close()
    wrong = int((got != expected).sum())
    assert torch.equal(got, expected), f"{op}: {wrong} wrong elements; first {got[:8]} vs {expected[:8]}"


@pytest.mark.parametrize("op,seed,n_valid", [
    ("store", 1, N - 13), ("load", 2, N - 29), ("get", 3, N - 5), ("put", 4, N - 64), ("copy", 5, N - 1),
    ("load, ranks as the original's code passes them", 6, N - 3),
    ("get, ranks as the original's code passes them", 7, N - 17),
    # get's cache modifiers: in the case above; put's: DeviceContext.put in test_device_context
    pytest.param("copy, cache modifiers", 8, N - 9, marks=pytest.mark.slow),
])
def test_rma(ranks, op, seed, n_valid):
    ranks.run(_rma_on_rank, op, seed=seed, n_valid=n_valid)


@triton.jit
def _tile_kernel(src, dst, rows, columns, peer, rank, heap_bases, PUT: tl.constexpr, TILE_M: tl.constexpr,
                 TILE_N: tl.constexpr):
    """One program per (TILE_M, TILE_N) tile of a row-major rows x columns matrix: a tile's rows are
    ``columns`` elements apart, and the last tiles are ragged (masked)."""
    tiles_n = tl.cdiv(columns, TILE_N)
    r = (tl.program_id(0) // tiles_n) * TILE_M + tl.arange(0, TILE_M)[:, None]
    c = (tl.program_id(0) % tiles_n) * TILE_N + tl.arange(0, TILE_N)[None, :]
    offs = r * columns + c
    mask = (r < rows) & (c < columns)
    if PUT:
        iris.put(src + offs, dst + offs, rank, peer, heap_bases, mask=mask)
    else:
        iris.get(src + offs, dst + offs, peer, rank, heap_bases, mask=mask)


def _tiles_on_rank(put: bool, rows: int, columns: int):
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    src = ctx.as_symmetric(_data(9, rank, n=rows * columns))
    dst = ctx.full((rows * columns,), POISON, dtype=torch.int32)
    ctx.barrier()
    grid = (triton.cdiv(rows, 16) * triton.cdiv(columns, 32),)
    _tile_kernel[grid](src, dst, rows, columns, nxt, rank, ctx.get_heap_bases(), PUT=put, TILE_M=16, TILE_N=32)
    ctx.barrier()
    got = dst.cpu()
    ctx.close()
    want = _data(9, prev if put else nxt, n=rows * columns)  # put: prev wrote into mine; get: I read nxt's
    assert torch.equal(got, want), f"{int((got != want).sum())} of {rows * columns} wrong"


@pytest.mark.parametrize("put", [True, False], ids=["put", "get"])
def test_tiles_of_a_wider_matrix_move_whole(ranks, put):
    """iris.put/get of 2-D tiles whose rows are apart (toward another node: one block transfer per row)."""
    ranks.run(_tiles_on_rank, put, rows=40, columns=100)


@triton.jit
def _atomic_kernel(target, vals, cmps, olds, n_valid, peer, rank, heap_bases, OP: tl.constexpr,
                   BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_valid
    ptr = target + offs
    val = tl.load(vals + offs)
    if OP == "add":
        old = iris.atomic_add(ptr, val, rank, peer, heap_bases, mask=mask, sem="acq_rel", scope="sys")
    elif OP == "sub":
        old = iris.atomic_sub(ptr, val, rank, peer, heap_bases, mask=mask, sem="release", scope="gpu")
    elif OP == "xchg":
        old = iris.atomic_xchg(ptr, val, rank, peer, heap_bases, mask=mask, sem="acquire")
    elif OP == "xor":
        old = iris.atomic_xor(ptr, val, rank, peer, heap_bases, mask=mask, sem="relaxed")
    elif OP == "and":
        old = iris.atomic_and(ptr, val, rank, peer, heap_bases, mask=mask, scope="cta")
    elif OP == "or":
        old = iris.atomic_or(ptr, val, rank, peer, heap_bases, mask=mask)
    elif OP == "min":
        old = iris.atomic_min(ptr, val, rank, peer, heap_bases, mask=mask, sem="acq_rel", scope="sys")
    elif OP == "max":
        old = iris.atomic_max(ptr, val, rank, peer, heap_bases, mask=mask, sem="acq_rel", scope="sys")
    else:  # cas: masked lanes cannot be excluded, so cmp never matches there
        old = iris.atomic_cas(ptr, tl.load(cmps + offs), val, rank, peer, heap_bases, sem="acq_rel", scope="sys")
    tl.store(olds + offs, old, mask=mask)


_MODEL = {
    "add": lambda a, v: a + v,
    "sub": lambda a, v: a - v,
    "xchg": lambda a, v: v,
    "xor": lambda a, v: a ^ v,
    "and": lambda a, v: a & v,
    "or": lambda a, v: a | v,
    "min": torch.minimum,
    "max": torch.maximum,
}


def _atomic_on_rank(op: str, seed: int, n_valid: int):
    """Single writer: each rank updates its successor's buffer; compare old values and memory to a model."""
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    initial = lambda r: _data(seed, r)  # noqa: E731
    vals = lambda r: _data(seed + 77, r)  # noqa: E731
    cmps = lambda r: torch.where(torch.arange(N) % 3 == 0, initial(nxt_of(r)), initial(nxt_of(r)) + 1)  # noqa: E731
    nxt_of = lambda r: (r + 1) % world  # noqa: E731
    target = ctx.as_symmetric(initial(rank))
    my_vals, my_cmps = ctx.as_symmetric(vals(rank)), ctx.as_symmetric(cmps(rank))
    olds = ctx.full((N,), POISON, dtype=torch.int32)
    ctx.barrier()
    _atomic_kernel[(triton.cdiv(N, BLOCK),)](target, my_vals, my_cmps, olds, n_valid, nxt, rank,
                                             ctx.get_heap_bases(), OP=op, BLOCK=BLOCK)
    ctx.barrier()
    got_target, got_olds = target.cpu(), olds.cpu()
    ctx.close()
    # My target was updated by prev with prev's vals; my olds are the initial values of nxt's target.
    expected_target = initial(rank).clone()
    if op == "cas":
        hit = cmps(prev) == initial(rank)
        expected_target = torch.where(hit, vals(prev), initial(rank))
        expected_olds = torch.full((N,), POISON, dtype=torch.int32)
        expected_olds[:n_valid] = initial(nxt)[:n_valid]
    else:
        expected_target[:n_valid] = _MODEL[op](initial(rank), vals(prev))[:n_valid]
        expected_olds = torch.full((N,), POISON, dtype=torch.int32)
        expected_olds[:n_valid] = initial(nxt)[:n_valid]
    differs = (got_target != expected_target).nonzero()[:5].flatten().tolist()
    assert torch.equal(got_target, expected_target), f"atomic_{op}: memory differs at {differs}"
    assert torch.equal(got_olds, expected_olds), f"atomic_{op}: returned old values differ"


@pytest.mark.parametrize("op,seed,n_valid", [
    ("add", 10, N - 7), ("sub", 11, N - 70), ("cas", 12, N), ("xchg", 13, N - 3), ("xor", 14, N - 100),
    ("and", 15, N - 11), ("or", 16, N - 2), ("min", 17, N - 33), ("max", 18, N - 64),
])
def test_atomic(ranks, op, seed, n_valid):
    ranks.run(_atomic_on_rank, op, seed=seed, n_valid=n_valid)


@triton.jit
def _contended_add_kernel(counters, rank, world_size, heap_bases, ROUNDS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for i in range(ROUNDS):
        for peer in range(world_size):
            iris.atomic_add(counters + offs, 1, rank, peer, heap_bases, sem="relaxed", scope="sys")


def _contended_add_on_rank(programs: int, rounds: int):
    """Every program of every rank adds 1 to every rank's counters: totals must be exact."""
    ctx = iris.iris(1 << 20)
    world = ctx.get_num_ranks()
    counters = ctx.zeros(16, dtype=torch.int32)
    ctx.barrier()
    _contended_add_kernel[(programs,)](counters, ctx.get_rank(), world, ctx.get_heap_bases(), ROUNDS=rounds,
                                       BLOCK=16)
    ctx.barrier()
    got = counters.cpu()
    ctx.close()
    assert torch.all(got == programs * rounds * world), f"lost updates: {got.tolist()}"


def test_contended_atomic_add_totals_exactly(ranks):
    ranks.run(_contended_add_on_rank, programs=4, rounds=25)


@triton.jit
def _context_kernel(context, src, dst, counter, rank: tl.constexpr, world_size: tl.constexpr, BLOCK: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world_size)
    offs = tl.arange(0, BLOCK)
    peer = (rank + 1) % world_size
    ctx.put(src + offs, dst + offs, to_rank=peer, load_cache_modifier=".cg", store_cache_modifier=".wt")
    ctx.atomic_add(counter, 1, to_rank=peer, sem="release", scope="sys")
    remote = ctx.load(src + offs, from_rank=peer)
    ctx.store(dst + BLOCK + offs, remote, to_rank=rank)


def _device_context_on_rank(seed: int):
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    src = ctx.as_symmetric(_data(seed, rank, n=32))
    dst = ctx.full((64,), POISON, dtype=torch.int32)
    counter = ctx.zeros(1, dtype=torch.int32)
    ctx.barrier()
    _context_kernel[(1,)](ctx.get_device_context(), src, dst, counter, rank=rank, world_size=world, BLOCK=32)
    ctx.barrier()
    got, count = dst.cpu(), int(counter.item())
    ctx.close()
    assert torch.equal(got[:32], _data(seed, (rank - 1) % world, n=32)), "DeviceContext.put"
    assert torch.equal(got[32:], _data(seed, (rank + 1) % world, n=32)), "DeviceContext.load/store"
    assert count == 1, f"DeviceContext.atomic_add: counter {count}"


def test_device_context(ranks):
    ranks.run(_device_context_on_rank, seed=20)
