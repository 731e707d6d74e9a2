"""iris.x's GEMM + communication tile ops, called per tile from a user's kernel (and as the device context's
methods), against torch: a K-split product all-reduced and reduce-scattered in its epilogue, a product
all-gathered by rows, and a product over a column-sharded operand read where each shard lies."""

import pytest
import torch
import triton
import triton.language as tl

import iris
import iris.x

M, N, K, BM, BN, BK = 20, 24, 32, 16, 16, 16  # ragged tiles: 2 x 2 of 16 x 16


@triton.jit
def _gemm_ops(a, b, partial, out, locks, context, M, N, K, rank: tl.constexpr, world: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, OP: tl.constexpr, METHOD: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world)
    tile = iris.x.TileView(tl.program_id(0), tl.program_id(1), BM, BN)
    if OP == "all_gather_gemm":  # a: this rank's (M, K / world) column shard
        a_view = iris.x.make_tensor_view(a, M, K // world, K // world, 1)
    else:
        a_view = iris.x.make_tensor_view(a, M, K, K, 1)
    b_view = iris.x.make_tensor_view(b, K, N, N, 1)
    src = iris.x.make_tensor_view(partial, M, N, N, 1)
    if OP == "gemm_all_gather":  # out: (world * M, N), rank r's product in rows [r * M, (r + 1) * M)
        dst = iris.x.make_tensor_view(out, world * M, N, N, 1)
    else:
        dst = iris.x.make_tensor_view(out, M, N, N, 1)
    if OP == "gemm_all_reduce":
        if METHOD:
            ctx.gemm_all_reduce(tile, a_view, b_view, src, dst, locks, BK)
        else:
            iris.x.gemm_all_reduce(tile, a_view, b_view, src, dst, locks, ctx, BK)
    elif OP == "gemm_reduce_scatter":
        iris.x.gemm_reduce_scatter(tile, a_view, b_view, src, dst, locks, ctx, BK)
    elif OP == "gemm_all_gather":
        if METHOD:
            ctx.gemm_all_gather(tile, a_view, b_view, dst, 0, BK)
        else:
            iris.x.gemm_all_gather(tile, a_view, b_view, dst, 0, ctx, BK)
    else:
        if METHOD:
            product = ctx.all_gather_gemm(tile, a_view, b_view, BK)
        else:
            product = iris.x.all_gather_gemm(tile, a_view, b_view, ctx, BK)
        ptrs, mask = dst.tile_ptr(product)
        tl.store(ptrs, product.data, mask=mask)


def _owned(rank, world, tiles_m, tiles_n):
    per = tiles_m * tiles_n // world
    first, last = rank * per, (tiles_m * tiles_n if rank == world - 1 else (rank + 1) * per)
    owned = torch.zeros(M, N, dtype=torch.bool)
    for t in range(first, last):
        tm, tn = divmod(t, tiles_n)
        owned[tm * BM:(tm + 1) * BM, tn * BN:(tn + 1) * BN] = True
    return owned


def _ops(ops, method):
    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    g = torch.Generator().manual_seed(7)
    As = [torch.randint(-3, 4, (M, K), generator=g).float() for _ in range(world)]
    Bs = [torch.randint(-3, 4, (K, N), generator=g).float() for _ in range(world)]
    tiles_m, tiles_n = triton.cdiv(M, BM), triton.cdiv(N, BN)
    failures = []
    for op in ops:
        if op == "all_gather_gemm":  # one (M, K) operand, column-sharded over the ranks; B whole
            whole, shard = As[0], K // world
            a = ctx.empty(M, shard)
            a.copy_(whole[:, rank * shard:(rank + 1) * shard])
            b = ctx.empty(K, N)
            b.copy_(Bs[0])
            want = whole @ Bs[0]
        else:
            a, b = ctx.empty(M, K), ctx.empty(K, N)
            a.copy_(As[rank])
            b.copy_(Bs[rank])
            want = (torch.cat([x @ y for x, y in zip(As, Bs)]) if op == "gemm_all_gather"
                    else sum(x @ y for x, y in zip(As, Bs)))
        partial = ctx.zeros(M, N)
        out = ctx.zeros(world * M if op == "gemm_all_gather" else M, N)
        locks = ctx.zeros(tiles_m * tiles_n, dtype=torch.int32)
        ctx.barrier()
        _gemm_ops[(tiles_m, tiles_n)](a, b, partial, out, locks, ctx.get_device_context(), M, N, K, rank=rank,
                                      world=world, BM=BM, BN=BN, BK=BK, OP=op, METHOD=method)
        ctx.device_barrier()
        ctx.barrier()
        got = out.cpu()
        if op == "gemm_reduce_scatter":
            owned = _owned(rank, world, tiles_m, tiles_n)
            ok = torch.equal(got[owned], want[owned]) and bool((got[~owned] == 0).all())
        else:
            ok = torch.equal(got, want)
        if not ok:
            failures.append(op)
    ctx.close()
    return failures


@pytest.mark.slow  # with the cross-compile gate on, its GEMM kernels add about 10 s
def test_a_gemm_all_reduce_and_an_all_gather_gemm_per_tile(ranks):
    for failures in ranks.run(_ops, ("gemm_all_reduce", "all_gather_gemm"), False):
        assert failures == []


@pytest.mark.slow
def test_gemm_reduce_scatter_and_gemm_all_gather_per_tile(ranks):
    for failures in ranks.run(_ops, ("gemm_reduce_scatter", "gemm_all_gather"), False):
        assert failures == []


@pytest.mark.slow
def test_the_gemm_tile_ops_as_methods_of_the_device_context(ranks):
    for failures in ranks.run(_ops, ("gemm_all_reduce", "gemm_all_gather", "all_gather_gemm"), True):
        assert failures == []
