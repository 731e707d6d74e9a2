"""iris.x: tile collectives called from a user's own kernel (a GEMM whose epilogue all-reduces its tiles, each
variant; the moving collectives on a matrix whose sizes the tiles do not divide; the original's calls: the
device context's methods, ctx.all_reduce with each AllReduceConfig, all_reduce_ring, gather), against torch."""

import pytest
import torch
import triton
import triton.language as tl

import iris
import iris.x

M, N, K, BM, BN, BK = 20, 24, 32, 16, 16, 16  # ragged tiles: 2 x 2 of 16 x 16


@triton.jit
def _gemm_all_reduce(a, b, partial, out, locks, context, M, N, K, rank: tl.constexpr, world: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, VARIANT: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world)
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        rk = k * BK + tl.arange(0, BK)
        x = tl.load(a + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        y = tl.load(b + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y, input_precision="ieee")
    tile = iris.x.Tile(pid_m, pid_n, BM, BN, acc)
    src = iris.x.make_tensor_view(partial, M, N, N, 1)
    dst = iris.x.make_tensor_view(out, M, N, N, 1)
    if VARIANT == "one_shot":
        iris.x.publish_tile(tile, src, locks, ctx)
        iris.x.all_reduce_one_shot(tile, src, dst, locks, ctx)
    elif VARIANT == "two_shot":
        iris.x.publish_tile(tile, src, locks, ctx)
        iris.x.all_reduce_two_shot(tile, src, dst, locks, rank, world, ctx)
    elif VARIANT == "reduce_scatter":
        iris.x.publish_tile(tile, src, locks, ctx)
        iris.x.reduce_scatter(tile, src, dst, locks, ctx)
    elif VARIANT == "atomic":
        iris.x.all_reduce_atomic(tile, dst, ctx)
    else:
        iris.x.all_reduce_spinlock(tile, dst, locks, ctx)


def _epilogues(variants):
    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    g = torch.Generator().manual_seed(5)
    As = [torch.randint(-3, 4, (M, K), generator=g).float() for _ in range(world)]
    Bs = [torch.randint(-3, 4, (K, N), generator=g).float() for _ in range(world)]
    want = sum(x @ y for x, y in zip(As, Bs))
    a, b = ctx.empty(M, K), ctx.empty(K, N)
    a.copy_(As[rank])
    b.copy_(Bs[rank])
    tiles_m, tiles_n = triton.cdiv(M, BM), triton.cdiv(N, BN)
    failures = []
    for variant in variants:
        partial, out = ctx.zeros(M, N), ctx.zeros(M, N)
        locks = ctx.zeros(tiles_m * tiles_n, dtype=torch.int32)
        ctx.barrier()
        _gemm_all_reduce[(tiles_m, tiles_n)](a, b, partial, out, locks, ctx.get_device_context(), M, N, K, rank=rank,
                                             world=world, BM=BM, BN=BN, BK=BK, VARIANT=variant)
        ctx.device_barrier()
        ctx.barrier()
        got = out.cpu()
        if variant == "reduce_scatter":
            owned = _owned(rank, world, tiles_m, tiles_n)
            ok = torch.equal(got[owned], want[owned]) and bool((got[~owned] == 0).all())
        else:
            ok = torch.equal(got, want)
        if not ok:
            failures.append(variant)
    ctx.close()
    return failures


def test_a_gemm_all_reduces_its_tiles_in_its_epilogue(ranks):
    for failures in ranks.run(_epilogues, ("one_shot",)):
        assert failures == []


@pytest.mark.slow
def test_every_epilogue_variant_and_reduce_scatter(ranks):
    for failures in ranks.run(_epilogues, ("two_shot", "atomic", "spinlock", "reduce_scatter")):
        assert failures == []


@triton.jit
def _moves(x, gathered_rows, gathered_cols, copied, a2a_in, a2a_out, context, M, N, root,
           rank: tl.constexpr, world: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, OP: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world)
    tile = iris.x.TileView(tl.program_id(0), tl.program_id(1), BM, BN)
    src = iris.x.make_tensor_view(x, M, N, N, 1)
    rows = iris.x.make_tensor_view(gathered_rows, world * M, N, N, 1)
    cols = iris.x.make_tensor_view(gathered_cols, M, world * N, world * N, 1)
    wide_in = iris.x.make_tensor_view(a2a_in, M, world * N, world * N, 1)
    wide_out = iris.x.make_tensor_view(a2a_out, M, world * N, world * N, 1)
    if OP == "all_gather":
        iris.x.all_gather(tile, src, rows, 0, ctx)
        iris.x.all_gather(tile, src, cols, 1, ctx)
    elif OP == "broadcast":
        iris.x.broadcast(tile, src, iris.x.make_tensor_view(copied, M, N, N, 1), root, ctx)
    elif OP == "all_to_all":  # over an (M, world * N) matrix: tiles of the output's columns
        iris.x.all_to_all(tile, wide_in, wide_out, N, ctx)
    elif OP == "ctx_all_gather":  # rows pulled from every rank; columns pushed from this rank's tile data
        ctx.all_gather(tile, src, rows, 0)
        ptrs, mask = src.tile_ptr(tile)
        ctx.all_gather(iris.x.Tile(tile.pid_m, tile.pid_n, BM, BN, tl.load(ptrs, mask=mask)), cols, 1)
    elif OP == "gather":  # root's tile, returned to the caller
        ptrs, mask = iris.x.make_tensor_view(copied, M, N, N, 1).tile_ptr(tile)
        tl.store(ptrs, iris.x.gather(tile, src, root, ctx), mask=mask)
    else:  # "ctx_all_to_all"
        ctx.all_to_all(tile, wide_in, wide_out, N)


def _moving(ops=("all_gather", "broadcast", "all_to_all")):
    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    xs = [torch.arange(M * N).float().view(M, N) + 10000 * r for r in range(world)]
    ins = [torch.arange(M * world * N).float().view(M, world * N) + 100000 * r for r in range(world)]
    x, a2a_in = ctx.empty(M, N), ctx.empty(M, world * N)
    x.copy_(xs[rank])
    a2a_in.copy_(ins[rank])
    rows, cols = ctx.zeros(world * M, N), ctx.zeros(M, world * N)
    copied, a2a_out = ctx.zeros(M, N), ctx.zeros(M, world * N)
    root = world - 1
    ctx.barrier()
    for op in ops:
        grid = (triton.cdiv(M, BM), triton.cdiv((world if op.endswith("all_to_all") else 1) * N, BN))
        _moves[grid](x, rows, cols, copied, a2a_in, a2a_out, ctx.get_device_context(), M, N, root, rank=rank,
                     world=world, BM=BM, BN=BN, OP=op)
    ctx.device_barrier()  # the pushed all_gather is complete after a barrier
    ctx.barrier()
    want_a2a = torch.cat([ins[s][:, rank * N:(rank + 1) * N] for s in range(world)], dim=1)
    results = {"rows": torch.equal(rows.cpu(), torch.cat(xs)), "cols": torch.equal(cols.cpu(), torch.cat(xs, dim=1)),
               "broadcast": torch.equal(copied.cpu(), xs[root]), "all_to_all": torch.equal(a2a_out.cpu(), want_a2a)}
    ctx.close()
    return results


def test_all_gather_broadcast_and_all_to_all_of_tiles(ranks):
    for results in ranks.run(_moving):
        assert all(results.values()), results


def test_the_context_moves_tiles_and_gather_returns_one(ranks):
    for results in ranks.run(_moving, ("ctx_all_gather", "gather", "ctx_all_to_all")):
        assert all(results.values()), results


def _owned(rank, world, tiles_m, tiles_n):
    """This rank's share of a reduce_scatter: a contiguous run of the tile numbers (row-major), the last rank the
    rest."""
    per = tiles_m * tiles_n // world
    owned = torch.zeros(M, N, dtype=torch.bool)
    for t in range(rank * per, tiles_m * tiles_n if rank == world - 1 else (rank + 1) * per):
        owned[(t // tiles_n) * BM:(t // tiles_n + 1) * BM, (t % tiles_n) * BN:(t % tiles_n + 1) * BN] = True
    return owned


@triton.jit
def _context_reductions(x, staged, out, locks, context, M, N, rank: tl.constexpr, world: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, OP: tl.constexpr, CODE: tl.constexpr):
    """The original's calls: ctx.all_reduce with and without an AllReduceConfig, ctx.reduce_scatter, the free
    all_reduce_ring and all_reduce_two_shot(tile, src, dst, locks, ctx). x holds each rank's input (there before
    the launch); ``staged`` is where a tile is published when flags order the ranks."""
    ctx = iris.TritonContext.initialize(context, rank, world)
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    view = iris.x.TileView(pid_m, pid_n, BM, BN)
    src = iris.x.make_tensor_view(x, M, N, N, 1)
    ptrs, mask = src.tile_ptr(view)
    tile = iris.x.Tile(pid_m, pid_n, BM, BN, tl.load(ptrs, mask=mask, other=0.0))
    dst = iris.x.make_tensor_view(out, M, N, N, 1)
    parts = iris.x.make_tensor_view(staged, M, N, N, 1)
    if OP == "default":
        ctx.all_reduce(tile, src, dst)
    elif OP == "flags":  # a variant that reads the peers' published tiles once their flags say so
        iris.x.publish_tile(tile, parts, locks, ctx)
        ctx.all_reduce(tile, parts, dst, config=iris.x.AllReduceConfig(CODE, locks))
    elif OP == "no_locks":  # the inputs are in every rank's x before the launch: no flags needed
        ctx.all_reduce(tile, src, dst, config=iris.x.AllReduceConfig(CODE))
    elif OP == "dummy_locks":
        ctx.all_reduce(tile, src, dst, config=iris.AllReduceConfig(CODE, tl.zeros((1,), dtype=tl.int32)))
    elif OP == "spinlock":
        ctx.all_reduce(tile, src, dst, config=iris.AllReduceConfig(CODE, locks), tile_id=pid_m * tl.cdiv(N, BN) + pid_n)
    elif OP == "ring":
        iris.x.all_reduce_ring(view, src, dst, ctx)
    elif OP == "two_shot_dealt":  # the original's signature: tiles dealt round-robin over the ranks
        iris.x.publish_tile(tile, parts, locks, ctx)
        iris.x.all_reduce_two_shot(tile, parts, dst, locks, ctx)
    elif OP == "reduce_scatter":
        ctx.reduce_scatter(tile, src, dst)
    else:  # "reduce_scatter_flags"
        iris.x.publish_tile(tile, parts, locks, ctx)
        ctx.reduce_scatter(tile, parts, dst, locks)


CONTEXT_REDUCTIONS = (("default", 0), ("no_locks", "atomic"), ("dummy_locks", 0), ("no_locks", "ring"),
                      ("no_locks", 1), ("flags", "one_shot"), ("no_locks", "one_shot"), ("flags", 3),
                      ("no_locks", "two_shot"), ("spinlock", "spinlock"), ("spinlock", 4), ("ring", 0),
                      ("two_shot_dealt", 0), ("reduce_scatter", 0), ("reduce_scatter_flags", 0))


def _context_reducing(cases):
    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    g = torch.Generator().manual_seed(11)
    xs = [torch.randint(-8, 9, (M, N), generator=g).float() for _ in range(world)]
    want = sum(xs)
    x = ctx.empty(M, N)
    x.copy_(xs[rank])
    tiles_m, tiles_n = triton.cdiv(M, BM), triton.cdiv(N, BN)
    failures = []
    for op, code in cases:
        staged, out = ctx.zeros(M, N), ctx.zeros(M, N)
        locks = ctx.zeros(tiles_m * tiles_n, dtype=torch.int32)
        ctx.barrier()
        _context_reductions[(tiles_m, tiles_n)](x, staged, out, locks, ctx.get_device_context(), M, N, rank=rank,
                                                world=world, BM=BM, BN=BN, OP=op, CODE=code)
        ctx.device_barrier()
        ctx.barrier()
        expected = want
        if op.startswith("reduce_scatter"):
            expected = torch.where(_owned(rank, world, tiles_m, tiles_n), want, torch.zeros(()))
        if not torch.equal(out.cpu(), expected):
            failures.append((op, code))
    ctx.close()
    return failures


def test_the_context_all_reduce_with_its_default_and_a_config(ranks):
    for failures in ranks.run(_context_reducing, (("default", 0), ("no_locks", "ring"), ("flags", "one_shot"))):
        assert failures == []


@pytest.mark.slow
def test_every_config_variant_ring_and_the_context_reduce_scatter(ranks):
    for failures in ranks.run(_context_reducing, CONTEXT_REDUCTIONS):
        assert failures == []


def test_the_config_is_exported_at_the_top_too():
    assert iris.AllReduceConfig is iris.x.AllReduceConfig
