"""iris.x tile collectives (called from a kernel here): every rank's result equals a float64 torch reference.

Each case draws a tile collective, a matrix the block sizes need not divide, block sizes and a dtype. Every rank
knows every rank's input (seeded): for the reductions, multiples of 1/4 no larger than 64 / world, so every partial
sum in any order is exact even in bfloat16 (the spinlock stores each one in the output's dtype, in lock order) and
the result must equal the reference; any bit pattern for the moves (bit-exact).
"""

import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import iris
import iris.x
from conformance import harness
from conformance.dtypes import element_size, values
from conformance.profiles import current

MOVES = ("all_gather_rows", "all_gather_cols", "broadcast", "gather", "all_to_all")
REDUCTIONS = ("one_shot", "two_shot", "reduce_scatter", "spinlock", "ring", "context")


@harness.jit
def _tiles(x, out, partial, locks, context, M, N, root, rank: tl.constexpr, world: tl.constexpr,
           BM: tl.constexpr, BN: tl.constexpr, OP: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, rank, world)
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    src = iris.x.make_tensor_view(x, M, N, N, 1)
    if OP == "all_gather_rows":
        iris.x.all_gather(iris.x.TileView(pid_m, pid_n, BM, BN), src,
                          iris.x.make_tensor_view(out, world * M, N, N, 1), 0, ctx)
    elif OP == "all_gather_cols":
        iris.x.all_gather(iris.x.TileView(pid_m, pid_n, BM, BN), src,
                          iris.x.make_tensor_view(out, M, world * N, world * N, 1), 1, ctx)
    elif OP == "broadcast":
        iris.x.broadcast(iris.x.TileView(pid_m, pid_n, BM, BN), src, iris.x.make_tensor_view(out, M, N, N, 1),
                         root, ctx)
    elif OP == "gather":  # root's tile, returned, stored here
        ptrs, mask = iris.x.make_tensor_view(out, M, N, N, 1).tile_ptr(iris.x.TileView(pid_m, pid_n, BM, BN))
        tl.store(ptrs, iris.x.gather(iris.x.TileView(pid_m, pid_n, BM, BN), src, root, ctx), mask=mask)
    elif OP == "ring":  # every rank's x is in place before the launch: no flags
        iris.x.all_reduce_ring(iris.x.TileView(pid_m, pid_n, BM, BN), src, iris.x.make_tensor_view(out, M, N, N, 1),
                               ctx)
    elif OP == "all_to_all":  # x and out are (M, world * N): tiles of out's columns
        wide = iris.x.make_tensor_view(x, M, world * N, world * N, 1)
        iris.x.all_to_all(iris.x.TileView(pid_m, pid_n, BM, BN), wide,
                          iris.x.make_tensor_view(out, M, world * N, world * N, 1), N, ctx)
    else:  # the reductions: this rank's tile of x as the tile's data
        ptrs, mask = src.tile_ptr(iris.x.TileView(pid_m, pid_n, BM, BN))
        tile = iris.x.Tile(pid_m, pid_n, BM, BN, tl.load(ptrs, mask=mask, other=0).to(tl.float32))
        parts = iris.x.make_tensor_view(partial, M, N, N, 1)
        dst = iris.x.make_tensor_view(out, M, N, N, 1)
        if OP == "spinlock":
            iris.x.all_reduce_spinlock(tile, dst, locks, ctx)
        elif OP == "context":  # the original's method, two_shot by its config (tiles dealt round-robin)
            iris.x.publish_tile(tile, parts, locks, ctx)
            ctx.all_reduce(tile, parts, dst, config=iris.x.AllReduceConfig("two_shot", locks))
        else:
            iris.x.publish_tile(tile, parts, locks, ctx)
            if OP == "one_shot":
                iris.x.all_reduce_one_shot(tile, parts, dst, locks, ctx)
            elif OP == "two_shot":
                iris.x.all_reduce_two_shot(tile, parts, dst, locks, rank, world, ctx)
            else:
                iris.x.reduce_scatter(tile, parts, dst, locks, ctx)


def _input(case, rank, shape):
    g = harness.generator(case["seed"], rank, 17)
    count = shape[0] * shape[1]
    if case["op"] in REDUCTIONS:  # |x| <= 64 / world: every partial sum, in any order, is exact in bfloat16
        bound = 256 // harness.context().get_num_ranks()
        return (torch.randint(-bound, bound + 1, (count,), generator=g) / 4).to(case["dtype"]).view(shape)
    return values(case["dtype"], count, g).view(shape)


def _tiles_on_rank(case):
    ctx = harness.context()
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    op, dtype, m, n, bm, bn = case["op"], case["dtype"], case["m"], case["n"], case["bm"], case["bn"]
    harness.fill_arena(case["seed"])
    wide = op == "all_to_all"
    shape = (m, world * n) if wide else (m, n)
    inputs = [_input(case, r, shape) for r in range(world)]
    out_shape = {"all_gather_rows": (world * m, n), "all_gather_cols": (m, world * n)}.get(op, shape)
    size = element_size(dtype)
    placed, offset = [], 0
    for count, kind in ((shape[0] * shape[1], dtype), (m * n, torch.float32), (out_shape[0] * out_shape[1], dtype)):
        placed.append(harness.region(offset, count, kind))
        offset += (count * element_size(kind) // 256 + 1) * 256
    x, partial, out = placed[0].view(shape), placed[1].view(m, n), placed[2].view(out_shape)
    x.copy_(harness.to_device(inputs[rank], device))
    out.zero_()
    tiles = (triton.cdiv(m, bm), triton.cdiv(shape[1] if wide else n, bn))
    locks = harness.region(offset, tiles[0] * tiles[1], torch.int32)
    locks.zero_()
    ctx.barrier()  # every rank's inputs, zeroed outputs and flags before any rank's kernel
    violations = harness.attempt(_tiles[tiles], x, out, partial, locks, ctx.get_device_context(), m, n,
                                 case["root"], rank=rank, world=world, BM=bm, BN=bn, OP=op)
    ctx.device_barrier()
    ctx.barrier()
    if op == "all_gather_rows":
        want = torch.cat(inputs)
    elif op == "all_gather_cols":
        want = torch.cat(inputs, dim=1)
    elif op in ("broadcast", "gather"):
        want = inputs[case["root"]]
    elif op == "all_to_all":
        want = torch.cat([inputs[s][:, rank * n:(rank + 1) * n] for s in range(world)], dim=1)
    else:
        want = torch.stack([t.double() for t in inputs]).sum(0).to(dtype)
        if op == "reduce_scatter":  # this rank's contiguous share of the tile numbers; zeros elsewhere
            per, total = tiles[0] * tiles[1] // world, tiles[0] * tiles[1]
            owned = torch.zeros(m, n, dtype=torch.bool)
            for t in range(rank * per, total if rank == world - 1 else (rank + 1) * per):
                r, c = divmod(t, tiles[1])
                owned[r * bm:(r + 1) * bm, c * bn:(c + 1) * bn] = True
            want = torch.where(owned, want, torch.zeros((), dtype=dtype))
    got = harness.byte_view(harness.to_device(out, "cpu")).view(-1, size)
    wrong = int((got != harness.byte_view(want).view(-1, size)).any(1).sum())
    if wrong and not violations:
        violations.append(f"{wrong} of {want.numel()} elements wrong")
    return harness.Verdict(violations)


@st.composite
def tile_cases(draw, world_size: int):
    op = draw(st.sampled_from(MOVES + REDUCTIONS))
    dtypes = (torch.float32, torch.float16, torch.bfloat16) if op in REDUCTIONS else (torch.float32, torch.bfloat16,
                                                                                      torch.int32)
    return dict(op=op, dtype=draw(st.sampled_from(dtypes)), m=draw(st.integers(1, 40)), n=draw(st.integers(1, 40)),
                bm=draw(st.sampled_from((16, 32))), bn=draw(st.sampled_from((16, 32))), seed=draw(harness.seeds()),
                root=draw(st.integers(0, world_size - 1)))


@settings(max_examples=current().examples(1))
@given(data=st.data())
def test_tile_collectives_match_the_reference(world, data):
    """iris.x's all_gather (rows, columns), broadcast, gather, all_to_all and the one_shot, two_shot, spinlock, ring
    all-reduces (two_shot also through ctx.all_reduce and an AllReduceConfig) and reduce_scatter, on matrices the
    blocks need not divide."""
    world.check(_tiles_on_rank, data.draw(tile_cases(world.size), label="case"))
