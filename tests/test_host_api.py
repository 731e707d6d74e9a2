"""Host API on 2 and 4 ranks: identity, heap bases, context tensor, barrier, broadcast, factories."""

import json
import os

import numpy as np
import pytest
import torch

import iris


def _identity_on_rank():
    ctx = iris.iris(1 << 20)
    bases = ctx.get_heap_bases()
    context = ctx.get_device_context()
    info = dict(rank=ctx.get_rank(), world=ctx.get_num_ranks(), device=str(ctx.get_device()),
                device_id=ctx.get_device_id(), cus=ctx.get_cu_count(), bases=bases.tolist(),
                bases_dtype=str(bases.dtype), bases_device=str(bases.device), context=context.tolist())
    ctx.close()
    return info


def test_identity_and_heap_bases(ranks):
    infos = ranks.run(_identity_on_rank)
    world = ranks.world_size
    assert [i["rank"] for i in infos] == list(range(world))
    assert all(i["world"] == world for i in infos)
    for info in infos:
        assert info["bases_dtype"] == "torch.int64" and info["bases_device"] == info["device"]
        assert len(info["bases"]) == world and len(set(info["bases"])) == world
        assert all(b % 256 == 0 for b in info["bases"])
        # [rank, world, bases...], then the tracing fields: all zeros while tracing is off (iris.device.tracing)
        assert info["context"][: 2 + world] == [info["rank"], world, *info["bases"]]
        assert len(info["context"]) == 2 + world + 4 + 13 and not any(info["context"][2 + world:])
        assert info["cus"] >= 1 and info["device_id"] >= 0


def _broadcast_on_rank(src):
    ctx = iris.iris(1 << 20)
    mine = ctx.get_rank() == src
    got = dict(
        scalar=ctx.broadcast(42.5 if mine else None, src=src),
        obj=ctx.broadcast({"k": [1, "two"]} if mine else None, src=src),
        tensor=ctx.broadcast(torch.arange(6).reshape(2, 3) if mine else None, src=src),
        array=ctx.broadcast(np.linspace(0, 1, 5) if mine else None, src=src),
        bf16=ctx.broadcast(torch.full((3,), 1.5, dtype=torch.bfloat16) if mine else None, src=src),
        named=ctx.broadcast("the original's keyword" if mine else None, source_rank=src),
    )
    ctx.close()
    return got


def test_broadcast_scalars_objects_tensors_arrays(ranks):
    src = ranks.world_size - 1
    for got in ranks.run(_broadcast_on_rank, src):
        assert got["scalar"] == 42.5 and got["obj"] == {"k": [1, "two"]}
        assert isinstance(got["tensor"], np.ndarray) and got["tensor"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert np.array_equal(got["array"], np.linspace(0, 1, 5))
        assert torch.equal(got["bf16"], torch.full((3,), 1.5, dtype=torch.bfloat16))
        assert got["named"] == "the original's keyword"


def _barrier_orders_writes_on_rank(rounds):
    """Each round, every rank writes its value into every peer's slot, then barrier, then checks all slots."""
    import triton

    from shared_kernels import write_slot_kernel

    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    slots = ctx.full((world,), -1, dtype=torch.int64)
    ctx.barrier()  # nobody writes into a peer's slots before the peer has initialized them
    for r in range(rounds):
        value = r * 100 + rank
        for peer in range(world):
            write_slot_kernel[(1,)](slots, value, rank, peer, ctx.get_heap_bases())
        ctx.barrier()
        seen = slots.tolist()
        assert seen == [r * 100 + p for p in range(world)], f"round {r}: stale slots {seen}"
        ctx.barrier()
    ctx.close()
    return triton.__version__


def test_barrier_makes_remote_writes_visible(ranks):
    ranks.run(_barrier_orders_writes_on_rank, 5)


def _factories_on_rank():
    ctx = iris.iris(1 << 22)
    checks = {}
    checks["zeros"] = torch.equal(ctx.zeros(2, 3).cpu(), torch.zeros(2, 3))
    checks["zeros_tuple"] = ctx.zeros((2, 3), dtype=torch.int16).shape == (2, 3)
    checks["ones"] = torch.equal(ctx.ones([4], dtype=torch.int32).cpu(), torch.ones(4, dtype=torch.int32))
    checks["full"] = torch.equal(ctx.full((3,), 7).cpu(), torch.full((3,), 7))
    checks["full_float"] = ctx.full((2,), 2.5).dtype == torch.get_default_dtype()
    checks["arange"] = torch.equal(ctx.arange(10).cpu(), torch.arange(10))
    checks["arange3"] = torch.equal(ctx.arange(1.0, 2.0, 0.25).cpu(), torch.arange(1.0, 2.0, 0.25))
    checks["linspace"] = torch.equal(ctx.linspace(0, 1, 7).cpu(), torch.linspace(0, 1, 7))
    checks["empty"] = ctx.empty(5, dtype=torch.float16).dtype == torch.float16
    dev = ctx.get_device()
    g1, g2 = torch.Generator(device=dev).manual_seed(3), torch.Generator(device=dev).manual_seed(3)
    checks["rand"] = torch.equal(ctx.rand(50, generator=g1), torch.rand(50, generator=g2, device=dev))
    checks["randn"] = torch.equal(ctx.randn(2, 5, generator=g1), torch.randn(2, 5, generator=g2, device=dev))
    checks["randint"] = torch.equal(ctx.randint(3, 9, (20,), generator=g1),
                                    torch.randint(3, 9, (20,), generator=g2, device=dev))
    r = ctx.randint(5, (100,))
    checks["randint_high_only"] = bool(((r >= 0) & (r < 5)).all()) and r.dtype == torch.int64
    u = ctx.uniform((1000,), low=-2.0, high=3.0)
    checks["uniform"] = bool(((u >= -2.0) & (u < 3.0)).all()) and float(u.std()) > 0.5
    x = ctx.randn(3, 4, dtype=torch.float64)
    checks["zeros_like"] = torch.equal(ctx.zeros_like(x).cpu(), torch.zeros(3, 4, dtype=torch.float64))
    checks["ones_like"] = torch.equal(ctx.ones_like(x, dtype=torch.int8).cpu(), torch.ones(3, 4, dtype=torch.int8))
    checks["full_like"] = torch.equal(ctx.full_like(x, 4).cpu(), torch.full((3, 4), 4, dtype=torch.float64))
    checks["empty_like"] = ctx.empty_like(x).shape == x.shape
    checks["rand_like"] = ctx.rand_like(x).dtype == torch.float64
    checks["randn_like"] = ctx.randn_like(x).shape == (3, 4)
    rl = ctx.randint_like(x, 2, 4)
    checks["randint_like"] = bool(((rl >= 2) & (rl < 4)).all())
    checks["requires_grad"] = ctx.zeros(3, requires_grad=True).requires_grad
    out = ctx.empty(6, dtype=torch.int64)
    res = ctx.arange(6, out=out)
    checks["out"] = res.data_ptr() == out.data_ptr() and res.tolist() == list(range(6))
    checks["device_cuda"] = ctx.zeros(2, device="cuda").device == dev
    made = [ctx.zeros(2), ctx.rand(3), ctx.full((1,), 1), ctx.arange(3), ctx.zeros_like(x), ctx.randint(3, (2,))]
    checks["all_symmetric"] = all(ctx.is_symmetric(t) for t in made)
    checks["not_symmetric"] = not ctx.is_symmetric(torch.zeros(3, device=dev))
    src = torch.randn(4, 4, device=dev)
    copy = ctx.as_symmetric(src)
    checks["as_symmetric"] = ctx.is_symmetric(copy) and torch.equal(copy, src) and copy.data_ptr() != src.data_ptr()
    a, b = ctx.empty(3, dtype=torch.int8), ctx.empty(1, dtype=torch.int8)
    checks["aligned"] = (b.data_ptr() - a.data_ptr()) % 256 == 0 and (a.data_ptr() - ctx.heap.base) % 256 == 0
    ctx.close()
    return {k: bool(v) for k, v in checks.items()}


def test_tensor_factories(ranks):
    for checks in ranks.run(_factories_on_rank):
        failed = [name for name, ok in checks.items() if not ok]
        assert not failed, f"factories that differ from torch: {failed}"


def _simulation_json_on_rank(prefix):
    os.environ["IRIS_SIMULATION"] = "1"
    os.environ["IRIS_HEAP_BASES_PREFIX"] = prefix
    try:
        ctx = iris.iris(1 << 20)
        bases = ctx.get_heap_bases().tolist()
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        ctx.close()
    finally:
        del os.environ["IRIS_SIMULATION"], os.environ["IRIS_HEAP_BASES_PREFIX"]
    with open(f"{prefix}_rank_{rank}_heap_bases.json") as f:
        written = json.load(f)
    assert written == {"rank": rank, "num_ranks": world, "heap_bases": [hex(b) for b in bases]}


def test_simulation_writes_heap_bases_json(ranks, tmp_path):
    ranks.run(_simulation_json_on_rank, str(tmp_path / "job"))


def _mismatched_heap_size_on_rank():
    with pytest.raises(ValueError, match="same heap_size"):
        iris.iris((1 << 20) + 256 * int(os.environ["RANK"]))


def test_heap_size_must_match_across_ranks(ranks):
    ranks.run(_mismatched_heap_size_on_rank)


def _create_and_close_many_on_rank(times):
    for i in range(times):
        ctx = iris.iris(1 << 16)
        t = ctx.full((8,), i, dtype=torch.int32)
        assert t.tolist() == [i] * 8
        ctx.close()
    leftovers = [n for n in os.listdir("/dev/shm") if n.startswith(f"iris_{os.environ['IRIS_JOB_ID']}")]
    return leftovers


def test_many_contexts_in_one_process(ranks):
    for leftovers in ranks.run(_create_and_close_many_on_rank, 25):
        assert leftovers == [], f"shared-memory segments left behind: {leftovers}"


def _barriers_after_one_rank_starts_late(late_rank: int):
    """iris.iris() with ``late_rank``'s device busy for about a second just before its context zeroes the
    barrier counters and landing flags (its stream runs them late), then device barriers and a push
    all_reduce at once: every rank's start must have zeroed them before any rank passes iris.iris(), or a
    peer's first arrival lands before the zeroing and is wiped (both ranks then wait for ever). On the CPU
    the zeroing is synchronous; the GPUs are where this can fail."""
    import iris.host.team
    from iris.ccl import Config

    late = int(os.environ["RANK"]) == late_rank
    original = iris.host.team.Team.__init__

    def starts_late(team, *args, **kwargs):
        if late and torch.cuda.is_available():
            torch.cuda._sleep(2_000_000_000)  # ~1 s of GPU cycles queued ahead of the zeroing
        original(team, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(iris.host.team.Team, "__init__", starts_late)
        ctx = iris.iris(1 << 20)
    x = ctx.full((64,), float(ctx.get_rank() + 1))
    out = ctx.zeros(64)
    for _ in range(3):
        ctx.device_barrier()
    ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="push"))
    ctx.barrier()
    total = out.unique().tolist()
    ctx.close()
    return total


@pytest.mark.parametrize("late_rank", [0, 1])
def test_a_rank_whose_device_starts_late_does_not_wipe_its_peers_first_arrivals(ranks, late_rank):
    world = ranks.world_size
    for total in ranks.run(_barriers_after_one_rank_starts_late, late_rank, timeout=90):
        assert total == [float(world * (world + 1) // 2)]


def _with_node_map(spec):
    """iris.iris() on the ipc heap with IRIS_NODE_MAP=spec (None: unset): (node map, or the error's type and
    message). The heap is named: under IRIS_HEAP=shmem a map of two nodes is taken, and would switch the
    engine path on in the rank process for every later test."""
    import os

    saved = os.environ.pop("IRIS_NODE_MAP", None)
    if spec is not None:
        os.environ["IRIS_NODE_MAP"] = spec
    try:
        ctx = iris.iris(1 << 16, heap="ipc")
        found = ctx.get_node_map()
        ctx.close()
        return found
    except (RuntimeError, ValueError) as exc:
        return type(exc).__name__, str(exc)
    finally:
        os.environ.pop("IRIS_NODE_MAP", None)
        if saved is not None:
            os.environ["IRIS_NODE_MAP"] = saved


def test_ranks_on_one_host_form_one_node_and_a_forced_map_is_checked(ranks):
    world = ranks.world_size
    assert ranks.run(_with_node_map, None) == [(0,) * world] * world  # one host: one node
    assert ranks.run(_with_node_map, ",".join(["3"] * world)) == [(3,) * world] * world
    for kind, message in ranks.run(_with_node_map, ",".join(str(r % 2) for r in range(world))):
        assert kind == "HeapProviderRefusal" and "2 nodes" in message and "inside one node" in message, message
    for kind, message in ranks.run(_with_node_map, "0,x"):
        assert kind == "ValueError" and "IRIS_NODE_MAP='0,x'" in message, message
    for kind, message in ranks.run(_with_node_map, "0"):
        assert kind == "ValueError" and f"{world} ranks" in message, message
