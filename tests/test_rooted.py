"""reduce, gather and scatter (iris.ccl.rooted) against torch on every member, every root, fused or not,
in place, over a group; the original's calls (``ctx.ccl.reduce(tensor, dst=...)``); misuse refused first."""

import pytest
import torch

import iris
from iris.ccl import Config, ReduceOp
from iris.testing import refusals

# one element, ragged blocks (1000 in blocks of 64), a matrix, a small matrix: every other one in the slow tier
# (one element, the matrix), the last in the default tier
SHAPES = ((1,), (1000,), (37, 29), (3, 5))
REDUCTIONS = ((torch.float32, ReduceOp.SUM), (torch.bfloat16, ReduceOp.MAX), (torch.int32, ReduceOp.MIN))
CONFIGS = (Config(block_size=64), Config(block_size=64, fused_bytes=0))  # one fused launch, or three


def _inputs(world, shape, dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(-50, 50, shape, generator=generator).to(dtype) for _ in range(world)]


def _rooted_calls(every_case):
    """reduce (SUM float32, MAX bfloat16, MIN int32; to ``output`` and in place), gather and scatter; every root,
    shape, reduction and launch form with ``every_case``, else one of each (the last rank as root)."""
    ctx = iris.iris(4 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    failures, seed = [], 0
    if every_case:
        roots, shapes, configs = range(world), SHAPES[::2], CONFIGS
    else:
        roots, shapes, configs = [world - 1], SHAPES[3:], CONFIGS[:1]
    for root in roots:
        for shape in shapes:
            for config in configs:
                seed += 1
                for dtype, op in REDUCTIONS if every_case else REDUCTIONS[:1]:
                    xs = _inputs(world, shape, dtype, seed)
                    x = ctx.empty(shape, dtype=dtype)
                    x.copy_(xs[rank])
                    out = torch.full(shape, -99, dtype=dtype, device=device)
                    ctx.ccl.reduce(out, x, dst=root, op=op, config=config)
                    stacked = torch.stack([t.float() for t in xs])
                    want = {ReduceOp.SUM: stacked.sum(0), ReduceOp.MAX: stacked.amax(0),
                            ReduceOp.MIN: stacked.amin(0)}[op].to(dtype)
                    expected = want if rank == root else torch.full(shape, -99, dtype=dtype)
                    if not torch.equal(out.cpu(), expected):
                        failures.append(("reduce", root, shape, op, config.fused_bytes))
                    ctx.ccl.reduce(x, dst=root, op=op, config=config)  # the original's call: in place
                    if not torch.equal(x.cpu(), want if rank == root else xs[rank]):
                        failures.append(("reduce in place", root, shape, op, config.fused_bytes))
                xs = _inputs(world, shape, torch.float16, seed)
                gathered = ctx.full((world * shape[0], *shape[1:]), -1.0, dtype=torch.float16)
                ctx.ccl.gather(gathered, xs[rank].to(device), dst=root, config=config)
                want = torch.cat(xs) if rank == root else torch.full(gathered.shape, -1.0, dtype=torch.float16)
                if not torch.equal(gathered.cpu(), want):
                    failures.append(("gather", root, shape, config.fused_bytes))
                blocks = torch.cat(xs).to(device) if rank == root else torch.zeros_like(gathered)
                mine = ctx.full(shape, -1.0, dtype=torch.float16)
                ctx.ccl.scatter(mine, blocks, src=root, config=config)
                if not torch.equal(mine.cpu(), xs[rank]):
                    failures.append(("scatter", root, shape, config.fused_bytes))
    ctx.close()
    return failures


def test_reduce_gather_scatter_match_torch(ranks):
    for failures in ranks.run(_rooted_calls, False):
        assert failures == []


@pytest.mark.slow
def test_reduce_gather_scatter_match_torch_for_every_root_shape_and_launch(ranks):
    for failures in ranks.run(_rooted_calls, True):
        assert failures == []


def _over_a_group_and_replayed():
    import torch.distributed as dist

    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    groups = [dist.new_group([r]) for r in range(world)]  # every rank makes every group
    seen = {}
    x = ctx.full((100,), float(rank + 1))
    ctx.ccl.reduce(x, dst=rank, group=groups[rank])  # a group of one: its own input
    seen["reduce alone"] = x.unique().tolist()
    out = ctx.zeros(world * 10)
    for step in range(3):  # the second and third calls replay the first's launches
        ctx.ccl.gather(out, torch.full((10,), float(10 * step + rank), device=ctx.get_device()), dst=0)
        seen[f"gather {step}"] = out.tolist() if rank == 0 else None
    ctx.close()
    return seen


def test_a_group_of_one_and_repeated_calls(ranks):
    for rank, seen in enumerate(ranks.run(_over_a_group_and_replayed)):
        assert seen["reduce alone"] == [rank + 1.0]
        if rank == 0:
            for step in range(3):
                world = len(seen[f"gather {step}"]) // 10
                assert seen[f"gather {step}"] == [float(10 * step + r) for r in range(world) for _ in range(10)]


def _misuse():
    ctx = iris.iris(1 << 20)
    world, device = ctx.get_num_ranks(), ctx.get_device()
    on_heap = ctx.zeros(world * 8)
    errors = refusals([
        lambda: ctx.ccl.reduce(on_heap, torch.zeros(world * 8, device=device), dst=0),  # input off the heap
        lambda: ctx.ccl.reduce(on_heap, dst=world),                                      # dst not a member
        lambda: ctx.ccl.reduce(on_heap[:8], on_heap, dst=0),                             # shapes differ
        lambda: ctx.ccl.gather(on_heap, on_heap[:7].clone(), dst=0),                     # output size
        lambda: ctx.ccl.gather(torch.zeros(world * 8, device=device), on_heap[:8].clone(), dst=0),  # off heap
        lambda: ctx.ccl.scatter(on_heap[:8], on_heap[:8].clone(), src=0),                # input size
        lambda: ctx.ccl.scatter(on_heap[:8], on_heap, src=-1),                           # src
    ])
    ctx.barrier()
    x = ctx.full((5,), float(ctx.get_rank() + 1))
    ctx.ccl.reduce(x, dst=0)  # still usable after the refusals
    ctx.close()
    return errors, x.tolist()


def test_misuse_is_refused_before_any_launch(ranks):
    results = ranks.run(_misuse)
    world = len(results)
    for rank, (errors, x) in enumerate(results):
        assert "input is not on the symmetric heap" in errors[0], errors
        assert "dst=" in errors[1] and "is not a member of the group" in errors[1], errors
        assert "output must have input's shape" in errors[2], errors
        assert "output must hold" in errors[3], errors
        assert "output is not on the symmetric heap" in errors[4], errors
        assert "input must hold" in errors[5], errors
        assert "src=-1" in errors[6], errors
        assert x == [float(world * (world + 1) // 2 if rank == 0 else rank + 1)] * 5, x


@pytest.mark.parametrize("what", ["reduce", "gather", "scatter"])
def test_each_is_a_method_of_ctx_ccl_with_the_originals_keywords(what):
    import inspect

    from iris.ccl import CCL

    parameters = inspect.signature(getattr(CCL, what)).parameters
    root = "src" if what == "scatter" else "dst"
    assert {root, "group", "async_op", "config"} <= set(parameters)
    assert parameters[root].default == 0
