"""The newest original iris.ccl surface: ctx.ccl.barrier, reduce_scatter's 2-D tile layout and its ring
workspace, all_gather's "ring" and "persistent_inline" variants with their preamble, Config.cache_modifier."""

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.ccl import Config, ReduceOp


@triton.jit
def _read_peer_kernel(buf, result, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(result + offs, iris.load(buf + offs, rank, peer, heap_bases))


# ---------------------------------------------------------------- Config


def test_config_accepts_the_newest_fields_with_the_originals_defaults():
    config = Config(cache_modifier=".wt", all_gather_variant="ring")
    assert config.cache_modifier == ".wt"
    assert Config().all_reduce_distribution == 1  # the original's newest default (block distribution)
    for variant in ("persistent", "partitioned", "ring", "persistent_inline"):
        assert Config(all_gather_variant=variant).all_gather_variant == variant


@pytest.mark.parametrize("field,value", [("cache_modifier", ".xx"), ("cache_modifier", 3),
                                         ("all_gather_variant", "tree")])
def test_config_names_a_bad_newest_field(field, value):
    with pytest.raises(ValueError) as info:
        Config(**{field: value})
    assert f"Config.{field}={value!r}" in str(info.value)


def test_the_original_workspace_names_exist():
    from iris.ccl.all_gather import AllGatherWorkspace, all_gather_preamble  # noqa: F401
    from iris.ccl.reduce_scatter import ReduceScatterWorkspace, _prepare_ring_workspace  # noqa: F401

    workspace = ReduceScatterWorkspace()
    assert (workspace.ring_buffer, workspace.flags, workspace.prepared, workspace.variant) == (None, None, False, None)
    assert AllGatherWorkspace().prepared is False


# ---------------------------------------------------------------- barrier


def _barrier_on_rank():
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    peer = (rank + 1) % world
    mine, seen = ctx.zeros(64), ctx.zeros(64)
    results = []
    for round_ in range(3):
        mine.fill_(float(rank + 100 * round_))
        ctx.ccl.barrier()  # every member's fill is done before anyone reads it
        _read_peer_kernel[(1,)](mine, seen, rank, peer, ctx.get_heap_bases(), BLOCK=64)
        ctx.ccl.barrier(async_op=True)  # nobody refills before everyone has read
        results.append(seen.cpu().tolist() == [float(peer + 100 * round_)] * 64)
    state = ctx._ccl_barrier_state
    first = state[None].data_ptr()
    ctx.ccl.barrier(group=None, async_op=False, config=Config())
    same = ctx._ccl_barrier_state[None].data_ptr() == first
    ctx.close()
    return results, same


def test_ccl_barrier_orders_every_members_writes(ranks):
    for rank, (results, same) in enumerate(ranks.run(_barrier_on_rank)):
        assert results == [True] * 3, (rank, results)
        assert same, rank


# ---------------------------------------------------------------- reduce_scatter, 2-D tiles


def _owned_tiles(m, n, bm, bn, group, world, place, distribution):
    """Reference: (rows, cols) slices of the tiles member ``place`` owns, from the tile numbering (tiles in
    groups of ``group`` tile rows, column by column inside a group) and the distribution."""
    rows, cols = -(-m // bm), -(-n // bn)
    total = rows * cols
    per = -(-total // world)
    if distribution == 0:
        ids = range(place, total, world)
    else:
        ids = range(place * per, min(total, (place + 1) * per))
    out = []
    for tile in ids:
        band, inside = divmod(tile, group * cols)
        height = min(rows - band * group, group)
        pm, pn = band * group + inside % height, inside // height
        out.append((slice(pm * bm, (pm + 1) * bm), slice(pn * bn, (pn + 1) * bn)))
    return out


RS_CASES = [  # (m, n, config fields)
    (64, 96, dict(block_size_m=16, block_size_n=32, swizzle_size=2, all_reduce_distribution=0)),
    (64, 96, dict(block_size_m=16, block_size_n=32, swizzle_size=2, all_reduce_distribution=1)),
    (37, 50, dict(block_size_m=16, block_size_n=16, swizzle_size=3, all_reduce_distribution=1)),  # ragged edges
    (20, 48, dict(block_size_m=8, block_size_n=16, reduce_scatter_variant="ring_chunked")),
]


def _reduce_scatter_tiles_on_rank():
    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    wrong = []
    for (m, n, fields), op, dtype in [(case, ReduceOp.SUM, torch.float32) for case in RS_CASES] + [
            (RS_CASES[2], ReduceOp.MAX, torch.int32), (RS_CASES[0], ReduceOp.SUM, torch.bfloat16)]:
        config = Config(**fields)

        def part(r):  # small multiples of 1/4: exact in every dtype
            g = torch.Generator().manual_seed(1000 * r + m)
            return (torch.randint(-40, 41, (m, n), generator=g) / (1 if dtype == torch.int32 else 4)).to(dtype)

        x = ctx.empty((m, n), dtype=dtype)
        x.copy_(part(rank).to(ctx.get_device()))
        poison = -7 if dtype == torch.int32 else float("nan")
        out = torch.full((m, n), poison, dtype=dtype, device=ctx.get_device())
        for fused in (True, False):
            out.fill_(poison)
            ctx.ccl.reduce_scatter(out, x, op=op, config=Config(**fields, fused_bytes=(1 << 30) if fused else 0))
            every = torch.stack([part(r).double() for r in range(world)])
            full = (every.sum(0) if op == ReduceOp.SUM else every.amax(0)).to(dtype)
            want = torch.full((m, n), poison, dtype=dtype)
            for rows, cols in _owned_tiles(m, n, config.block_size_m, config.block_size_n, config.swizzle_size,
                                           world, rank, config.all_reduce_distribution):
                want[rows, cols] = full[rows, cols]
            got = out.cpu()
            if not torch.equal(got.isnan(), want.isnan()) or not torch.equal(got.nan_to_num(0), want.nan_to_num(0)):
                wrong.append((m, n, fields, str(dtype), fused))
    ctx.close()
    return wrong


def test_reduce_scatter_gives_each_member_its_tiles_in_the_originals_layout(ranks):
    """Same-shape input and output: member i gets the reduction of the (block_size_m x block_size_n) tiles it
    owns (striding or block distribution, tile numbers swizzled by swizzle_size); the rest is left alone."""
    for rank, wrong in enumerate(ranks.run(_reduce_scatter_tiles_on_rank)):
        assert wrong == [], (rank, wrong)


def _ring_workspace_on_rank():
    from iris.ccl.reduce_scatter import ReduceScatterWorkspace, _prepare_ring_workspace

    ctx = iris.iris(1 << 22)
    x, out = ctx.zeros((64, 64)), ctx.zeros((64, 64))
    workspace = ReduceScatterWorkspace()
    _prepare_ring_workspace(ctx, 64, 64, torch.float32, 4, workspace)  # tiles of 32 x 32: 4
    ctx.ccl.reduce_scatter(out, x, config=Config(reduce_scatter_variant="ring_chunked", block_size_m=32,
                                                 block_size_n=32), workspace=workspace)
    try:
        ctx.ccl.reduce_scatter(out, x, config=Config(reduce_scatter_variant="ring_chunked", block_size_m=16,
                                                     block_size_n=16), workspace=workspace)
        error = None
    except ValueError as exc:
        error = str(exc)
    ctx.barrier()
    ctx.close()
    return error, workspace.prepared, workspace.variant


def test_reduce_scatter_ring_workspace_too_small_is_refused(ranks):
    for error, prepared, variant in ranks.run(_ring_workspace_on_rank):
        assert error is not None and "Flags array too small" in error, error
        assert prepared and variant == "ring_chunked"


# ---------------------------------------------------------------- all_gather variants


def _all_gather_variants_on_rank():
    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    wrong = []
    for variant, m, n, dtype, cache in [("ring", 24, 40, torch.float16, None), ("ring", 3, 5, torch.int32, None),
                                        ("persistent_inline", 24, 40, torch.bfloat16, ".wt"),
                                        ("persistent", 17, 9, torch.float32, ".cg"),
                                        ("copies", 24, 40, torch.bfloat16, None), ("copies", 3, 5, torch.int32, None)]:
        config = Config(all_gather_variant=variant, block_size=64, cache_modifier=cache)

        def part(r):
            return (torch.arange(m * n).reshape(m, n) % 251 * (r + 1) + r).to(dtype)

        x = ctx.empty((m, n), dtype=dtype)
        x.copy_(part(rank).to(ctx.get_device()))
        out = ctx.full((world * m, n), -3, dtype=dtype)
        workspace = ctx.ccl.all_gather_preamble(out, x, config=config)
        for _ in range(3):  # again and again: the ring's flags are left ready for the next call
            out.fill_(-3)
            ctx.ccl.all_gather(out, x, config=config, workspace=workspace)
            if not torch.equal(out.cpu(), torch.cat([part(r) for r in range(world)])):
                wrong.append((variant, m, n, str(dtype)))
        ctx.ccl.all_gather(out, x, config=config)  # without the preamble's workspace too
        if not torch.equal(out.cpu(), torch.cat([part(r) for r in range(world)])):
            wrong.append((variant, m, n, str(dtype), "no workspace"))
    ctx.close()
    return wrong


def test_all_gather_ring_persistent_inline_and_copies_gather_exactly(ranks):
    for rank, wrong in enumerate(ranks.run(_all_gather_variants_on_rank)):
        assert wrong == [], (rank, wrong)


def _all_gather_by_copies_from_a_torch_tensor_in_a_team():
    ctx = iris.iris(1 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    team = list(range(world))  # a team given as a list of ranks: every rank here
    out = ctx.zeros(world * 8, 6)
    wrong = []
    for round_ in range(3):
        x = torch.full((8, 6), float(rank * 10 + round_), device=device)  # not on the heap: read locally only
        ctx.ccl.all_gather(out, x, group=team, config=Config(all_gather_variant="copies"))
        expected = torch.cat([torch.full((8, 6), float(r * 10 + round_)) for r in range(world)])
        if not torch.equal(out.cpu(), expected):
            wrong.append(round_)
    ctx.close()
    return wrong


def test_all_gather_by_copies_reads_any_input_and_serves_a_team(ranks):
    assert ranks.run(_all_gather_by_copies_from_a_torch_tensor_in_a_team) == [[]] * ranks.world_size
