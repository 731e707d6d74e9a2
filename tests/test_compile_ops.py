"""``torch.ops.iris.*`` (iris.compile): each op against a torch reference, called eagerly and traced by
torch.compile(fullgraph=True) with no graph break."""

import pytest
import torch

import iris

M, N, K = 8, 12, 16  # M divides by 2 and 4 ranks (reduce_scatter_tensor), N by 2, 3 and 4 (all_to_all)


def _input(rank: int, shape=(M, N), dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(*shape, generator=g).to(dtype)


def _references(world: int, rank: int) -> dict:
    xs = [_input(r) for r in range(world)]
    total = sum(x.double() for x in xs)
    rows = M // world
    cols = N // world
    chunks = [x[:, rank * cols:(rank + 1) * cols] for x in xs]
    a = [_input(r, (M, K), torch.bfloat16) for r in range(world)]
    b = [_input(r + 50, (K, N), torch.bfloat16) for r in range(world)]
    return {
        "all_reduce": total,
        "all_reduce_max": torch.stack([x.double() for x in xs]).amax(0),
        "residual": xs[rank].double() * 0.5 + total,
        "rmsnorm": torch.nn.functional.rms_norm(xs[rank].double() * 0.5 + total, (N,), eps=1e-6),
        "all_gather": torch.cat([x.double() for x in xs]),
        "reduce_scatter_tensor": total[rank * rows:(rank + 1) * rows],
        "all_to_all": torch.cat(chunks, dim=1).double(),
        "broadcast": xs[1 % world].double(),
        "matmul_all_reduce": sum(ai.double() @ bi.double() for ai, bi in zip(a, b)),
        "matmul_all_gather": torch.cat([ai.double() @ b[0].double() for ai in a]),
    }


def _program(x, a, b_own, b_shared):
    """Every functional op once; returns their results by name (the in-place one acts on a copy)."""
    inplace = x.clone()
    torch.ops.iris.all_reduce_(inplace)
    normed, residual = torch.ops.iris.all_reduce_rmsnorm(x, x * 0.5, torch.ones(x.shape[1], device=x.device))
    return {
        "rmsnorm": normed,
        "residual": residual,
        "all_reduce": torch.ops.iris.all_reduce(x),
        "all_reduce_max": torch.ops.iris.all_reduce(x, "max"),
        "all_reduce_": inplace,
        "all_gather": torch.ops.iris.all_gather(x),
        "reduce_scatter": torch.ops.iris.reduce_scatter(x),
        "reduce_scatter_tensor": torch.ops.iris.reduce_scatter_tensor(x),
        "all_to_all": torch.ops.iris.all_to_all(x),
        "broadcast": torch.ops.iris.broadcast(x, 1),
        "matmul_all_reduce": torch.ops.iris.matmul_all_reduce(a, b_own),
        "matmul_all_gather": torch.ops.iris.matmul_all_gather(a, b_shared),
    }


def _run_ops(compiled: bool):
    """(results on this rank, graph breaks counted by dynamo) of _program, eager or compiled."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    ctx = iris.iris(1 << 24)
    iris.compile.set_context(ctx)
    rank = ctx.get_rank()
    device = ctx.get_device()
    args = (_input(rank), *(_input(seed, shape, torch.bfloat16) for seed, shape in  # the fused ops' operands
                            ((rank, (M, K)), (rank + 50, (K, N)), (50, (K, N)))))
    args = tuple(t.to(device) for t in args)
    fn = _program
    if compiled:
        torch._dynamo.reset()
        counters.clear()
        fn = torch.compile(_program, fullgraph=True, backend="aot_eager")
    results = {name: t.cpu() for name, t in fn(*args).items()}
    again = {name: t.cpu() for name, t in fn(*args).items()}  # the kept buffers, reused
    breaks = sum(counters["graph_break"].values()) if compiled else 0
    ctx.barrier()
    ctx.close()
    return results, again, breaks, [x.cpu() for x in args]


def _check(per_rank):
    world = len(per_rank)
    sums = torch.zeros(M, N, dtype=torch.float64)
    for rank, (results, again, breaks, _) in enumerate(per_rank):
        assert breaks == 0, f"rank {rank}: {breaks} graph breaks"
        want = _references(world, rank)
        for name, expected in want.items():
            got = results[name].double()
            assert got.shape == expected.shape, (name, got.shape, expected.shape)
            if name.startswith("matmul"):  # bf16 operands and output: the output's rounding
                error = ((got - expected).norm() / expected.norm()).item()
                assert error <= 1e-2, f"rank {rank}: {name} relative error {error}"
            else:
                assert torch.allclose(got, expected, rtol=1e-4, atol=1e-4), f"rank {rank}: {name}"
        assert torch.allclose(results["all_reduce_"].double(), want["all_reduce"], rtol=1e-4, atol=1e-4)
        for name in results:
            assert torch.equal(results[name], again[name]), f"rank {rank}: {name} differs on the second call"
        sums += results["reduce_scatter"].double()
    # the original's layout: each element of the sum on exactly one rank, zeros on the others
    total = _references(world, 0)["all_reduce"]
    assert torch.allclose(sums, total, rtol=1e-4, atol=1e-4)
    owners = sum((results["reduce_scatter"] != 0).int() for results, *_ in per_rank)
    assert (owners == 1).all()


@pytest.mark.slow
def test_the_ops_match_torch_when_called_eagerly(ranks):
    _check(ranks.run(_run_ops, False))


@pytest.mark.slow
def test_the_ops_trace_under_torch_compile_fullgraph_with_no_graph_break(ranks):
    _check(ranks.run(_run_ops, True))


def _inductor_layer():
    """A layer as a tensor-parallel model writes it, compiled by inductor (generated C++ on the CPU)."""
    ctx = iris.iris(1 << 24)
    iris.compile.set_context(ctx)
    rank, device = ctx.get_rank(), ctx.get_device()
    x, w = _input(rank, (M, K)).to(device), _input(rank + 50, (K, N)).to(device)

    def layer(x, w):
        return torch.nn.functional.gelu(torch.ops.iris.all_reduce(x @ w)) + 1

    got = torch.compile(layer, fullgraph=True)(x, w).cpu()
    ctx.barrier()
    ctx.close()
    return got


@pytest.mark.slow
def test_a_layer_compiled_by_inductor_gives_the_eager_result(ranks):
    world = ranks.world_size
    if world != 2:
        pytest.skip("inductor's code generation is checked at 2 ranks (a minute of C++ builds); the ops at every "
                    "world size through aot_eager")
    total = sum(_input(r, (M, K)).double() @ _input(r + 50, (K, N)).double() for r in range(world))
    want = torch.nn.functional.gelu(total) + 1
    for rank, got in enumerate(ranks.run(_inductor_layer)):
        assert torch.allclose(got.double(), want, rtol=1e-4, atol=1e-4), f"rank {rank}"


def _refusals():
    ctx = iris.iris(1 << 16)
    iris.compile.set_context(ctx)
    messages = []
    for call in (lambda: torch.ops.iris.all_reduce(torch.ones(4), "mean"),
                 lambda: torch.ops.iris.reduce_scatter_tensor(torch.ones(2 * ctx.get_num_ranks() + 1, 2))):
        try:
            call()
            messages.append(None)
        except Exception as exc:  # noqa: BLE001  (the message is what is checked)
            messages.append(str(exc))
    ctx.close()
    return messages


def test_bad_arguments_are_refused_by_name(ranks):
    for messages in ranks.run(_refusals):
        assert "op='mean'" in messages[0] and "'sum', 'max', 'min'" in messages[0], messages[0]
        assert "reduce_scatter_tensor" in messages[1] and "divide" in messages[1], messages[1]


def test_without_a_context_the_error_names_set_context():
    import iris.compile.functional as functional

    saved, functional._context = functional._context, None
    try:
        with pytest.raises(RuntimeError, match=r"iris\.compile\.set_context"):
            torch.ops.iris.all_reduce(torch.ones(2))
    finally:
        functional._context = saved


def _small_all_reduces_off_the_heap():
    """A small tensor off the heap (ll at this size) goes into all_reduce and all_reduce_ as it is: right
    results, and no heap buffer kept for it."""
    import iris.compile.functional as functional

    ctx = iris.iris(1 << 20)
    iris.compile.set_context(ctx)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    x = torch.arange(64, dtype=torch.float32, device=device) * (rank + 1)
    want = torch.arange(64, dtype=torch.float32, device=device) * (world * (world + 1) // 2)
    got = torch.ops.iris.all_reduce(x)
    y = x.clone()
    torch.ops.iris.all_reduce_(y)
    kept = list(functional._kept.get(ctx, {}))
    right = torch.equal(got, want) and torch.equal(y, want) and torch.equal(x, want / (world * (world + 1) // 2)
                                                                             * (rank + 1))
    ctx.close()
    return right, kept


def test_small_all_reduces_read_their_input_where_it_is(ranks):
    for rank, (right, kept) in enumerate(ranks.run(_small_all_reduces_off_the_heap)):
        assert right, rank
        assert kept == [], (rank, kept)
