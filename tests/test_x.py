"""iris.x: tile collectives called from a user's own kernel (a GEMM whose epilogue all-reduces its tiles, each
variant; the moving collectives on a matrix whose sizes the tiles do not divide), against torch."""

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
        if variant == "reduce_scatter":  # this rank's contiguous share of the tile numbers
            per = tiles_m * tiles_n // world
            mine = range(rank * per, tiles_m * tiles_n if rank == world - 1 else (rank + 1) * per)
            owned = torch.zeros(M, N, dtype=torch.bool)
            for t in mine:
                owned[(t // tiles_n) * BM:(t // tiles_n + 1) * BM, (t % tiles_n) * BN:(t % tiles_n + 1) * BN] = True
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
    if OP == "all_gather":
        iris.x.all_gather(tile, src, iris.x.make_tensor_view(gathered_rows, world * M, N, N, 1), 0, ctx)
        iris.x.all_gather(tile, src, iris.x.make_tensor_view(gathered_cols, M, world * N, world * N, 1), 1, ctx)
    elif OP == "broadcast":
        iris.x.broadcast(tile, src, iris.x.make_tensor_view(copied, M, N, N, 1), root, ctx)
    else:  # all_to_all over an (M, world * N) matrix: tiles of the output's columns
        iris.x.all_to_all(tile, iris.x.make_tensor_view(a2a_in, M, world * N, world * N, 1),
                          iris.x.make_tensor_view(a2a_out, M, world * N, world * N, 1), N, ctx)


def _moving():
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
    for op, grid in (("all_gather", (triton.cdiv(M, BM), triton.cdiv(N, BN))),
                     ("broadcast", (triton.cdiv(M, BM), triton.cdiv(N, BN))),
                     ("all_to_all", (triton.cdiv(M, BM), triton.cdiv(world * N, BN)))):
        _moves[grid](x, rows, cols, copied, a2a_in, a2a_out, ctx.get_device_context(), M, N, root, rank=rank,
                     world=world, BM=BM, BN=BN, OP=op)
    ctx.barrier()
    want_a2a = torch.cat([ins[s][:, rank * N:(rank + 1) * N] for s in range(world)], dim=1)
    results = {"rows": torch.equal(rows.cpu(), torch.cat(xs)), "cols": torch.equal(cols.cpu(), torch.cat(xs, dim=1)),
               "broadcast": torch.equal(copied.cpu(), xs[root]), "all_to_all": torch.equal(a2a_out.cpu(), want_a2a)}
    ctx.close()
    return results


def test_all_gather_broadcast_and_all_to_all_of_tiles(ranks):
    for results in ranks.run(_moving):
        assert all(results.values()), results
