"""put, signal, wait_until and device_barrier captured in one CUDA graph and replayed many times."""

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.host.replay import bind, captured_graph, graph_launcher
from iris.runtime import SELECTED as BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "cuda", reason="CUDA graphs need the cuda backend (a GPU)")

N, BLOCK, REPLAYS = 1000, 1024, 25


@triton.jit
def _bump(src, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(src + offs, tl.load(src + offs, mask=offs < n) + 1, mask=offs < n)


@triton.jit
def _exchange(src, dst, flags, rounds, cur, peer, prev, n, heap_bases, BLOCK: tl.constexpr):
    """Put to the next rank and signal it; wait for the previous rank's signal (a ring)."""
    offs = tl.arange(0, BLOCK)
    r = tl.load(rounds) + 1  # the round lives in memory, so each replay is a new one
    iris.put(src + offs, dst + offs, cur, peer, heap_bases, mask=offs < n)
    iris.signal(flags + cur, r, cur, peer, heap_bases)
    iris.wait_until(flags + prev, ">=", r)
    tl.store(rounds, r)


def _replay_on_rank():
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    peer, prev = (rank + 1) % world, (rank - 1) % world
    src = ctx.as_symmetric(torch.arange(N, dtype=torch.int32) * world + rank)
    dst = ctx.full((N,), -1, dtype=torch.int32)
    flags = ctx.zeros(world, dtype=torch.int64)
    rounds = torch.zeros(1, dtype=torch.int64, device=ctx.get_device())
    stream = torch.cuda.Stream()

    def step():
        _bump[(1,)](src, N, BLOCK=BLOCK)
        _exchange[(1,)](src, dst, flags, rounds, rank, peer, prev, N, ctx.get_heap_bases(), BLOCK=BLOCK)
        ctx.device_barrier()

    ctx.barrier()
    with torch.cuda.stream(stream):
        step()  # round 1, uncaptured: compiles the kernels and builds the barrier's state
    stream.synchronize()
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()  # captured, not run
    torch.cuda.synchronize()
    ctx.barrier()
    wrong = []
    for replay in range(1, REPLAYS + 1):
        graph.replay()
        torch.cuda.synchronize()
        expected = torch.arange(N, dtype=torch.int32) * world + prev + 1 + replay
        if not torch.equal(dst.cpu(), expected):
            wrong.append(replay)
        ctx.barrier()  # nobody's next put lands while a peer still checks
    ctx.close()
    return wrong


def test_graph_replays_move_fresh_data_every_time(ranks):
    assert ranks.run(_replay_on_rank) == [[]] * ranks.world_size


def test_a_graph_launcher_runs_the_captured_launches_again_on_the_current_stream():
    """captured_graph, then graph_launcher(graph): each call runs the captured work once more, on the stream
    current at the call; on CUDA by the driver's cuGraphLaunch, not by the graph's replay()."""
    x = torch.zeros(N, dtype=torch.int32, device="cuda")
    bump = bind(_bump, (1,), x, N, BLOCK=BLOCK)
    bump()  # compiled and run once, uncaptured
    torch.cuda.synchronize()
    graph = captured_graph([bump])
    launch_graph = graph_launcher(graph, torch.cuda.current_device())
    if torch.version.cuda is not None and hasattr(graph, "raw_cuda_graph_exec"):
        assert getattr(launch_graph, "__self__", None) is not graph
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(REPLAYS):
            launch_graph()
    stream.synchronize()
    assert torch.equal(x.cpu(), torch.full((N,), 1 + REPLAYS, dtype=torch.int32))


def _collectives_replay_on_rank():
    """all_reduce (two_shot, in place) and all_gather captured once, replayed on fresh inputs."""
    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    x = ctx.zeros(N, dtype=torch.float32)
    gathered = ctx.zeros(world * N, dtype=torch.float32)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    config = iris.ccl.Config(all_reduce_variant="two_shot")

    def step():
        ctx.ccl.all_reduce(x, x, config=config)
        ctx.ccl.all_gather(gathered, x)

    with torch.cuda.stream(stream):
        step()  # uncaptured: compiles, caches the group's member tensor
    stream.synchronize()
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    torch.cuda.synchronize()
    wrong = []
    for replay in range(1, REPLAYS + 1):
        with torch.cuda.stream(stream):
            x.copy_(torch.arange(N, dtype=torch.float32, device=x.device) + rank + replay)
            graph.replay()
        stream.synchronize()
        total = torch.arange(N, dtype=torch.float32) * world + sum(range(world)) + world * replay
        if not (torch.equal(x.cpu(), total) and torch.equal(gathered.cpu(), total.repeat(world))):
            wrong.append(replay)
        ctx.barrier()
    ctx.close()
    return wrong


def test_collectives_replay_in_a_graph(ranks):
    assert ranks.run(_collectives_replay_on_rank) == [[]] * ranks.world_size


def _eager_calls_from_graphs_on_rank(setting, native=None, direct=None):
    """Repeated eager calls (fresh data each time) replay a graph captured on their second call unless
    IRIS_GRAPH_REPLAY=0 (``setting``; None: unset), launched from C where IRIS_NATIVE_REPLAY=1 (``native``), or
    a call of one kernel relaunched by cuLaunchKernel where IRIS_DIRECT_LAUNCH=1 (``direct``); a call inside the
    user's own capture runs its launches into that capture instead. Returns the wrong calls, how many remembered
    calls have a fast launch (a graph or a packed kernel) and how many of them are packed kernels."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in (("IRIS_GRAPH_REPLAY", setting), ("IRIS_NATIVE_REPLAY", native),
                            ("IRIS_DIRECT_LAUNCH", direct)):
            if value is None:
                env.delenv(name, raising=False)
            else:
                env.setenv(name, value)
        ctx = iris.iris(1 << 22)
        ccl = ctx.ccl  # its remembered calls read the switches now
    if native == "1" and setting != "0":
        assert ccl._plans._native is not None, "IRIS_NATIVE_REPLAY=1: the C path was not built (see the warning)"
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    x, out = ctx.zeros(N, dtype=torch.float32), ctx.zeros(N, dtype=torch.float32)
    gathered = ctx.zeros(world * N, dtype=torch.float32)
    base = torch.arange(N, dtype=torch.float32, device=x.device)
    wrong = []

    def check(call, total):
        if not (torch.equal(out.cpu(), total) and torch.equal(gathered.cpu(), total.repeat(world))):
            wrong.append(call)

    for call in range(1, 6):
        x.copy_(base + rank + call)
        ccl.all_reduce(out, x)
        ccl.all_gather(gathered, out)
        torch.cuda.synchronize()
        check(call, torch.arange(N, dtype=torch.float32) * world + sum(range(world)) + world * call)
        ctx.barrier()
    graphs = sum(plan.launch_graph is not None for plan in ccl._plans.plans())
    packed = sum(len(plan.native or ()) == 8 for plan in ccl._plans.plans())
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        ccl.all_reduce(out, x)
        ccl.all_gather(gathered, out)
    for replay in range(6, 9):
        with torch.cuda.stream(stream):
            x.copy_(base + rank + replay)
            graph.replay()
        stream.synchronize()
        check(replay, torch.arange(N, dtype=torch.float32) * world + sum(range(world)) + world * replay)
        ctx.barrier()
    ctx.close()
    return wrong, graphs, packed


@pytest.mark.parametrize("setting, native, graphs", [(None, None, 2), ("1", None, 2), ("0", None, 0), (None, "1", 2),
                                                     ("0", "1", 0), (None, "0", 2)],
                         ids=["default", "on", "off", "native", "native-graphs-off", "python"])
def test_repeated_eager_calls_replay_from_a_graph_unless_turned_off(ranks, setting, native, graphs):
    assert ranks.run(_eager_calls_from_graphs_on_rank, setting, native) == [([], graphs, 0)] * ranks.world_size


@pytest.mark.parametrize("native", ["1", "0"], ids=["from-c", "from-python"])
def test_a_repeated_call_of_one_kernel_relaunches_it_packed_with_direct_launch(ranks, native):
    """IRIS_DIRECT_LAUNCH=1: the all_reduce of a small message (one kernel) is relaunched by cuLaunchKernel with its
    arguments packed once (iris.host.replay.direct), from C or Python, and every call's result is right."""
    results = ranks.run(_eager_calls_from_graphs_on_rank, None, native, "1")
    assert all(wrong == [] and graphs == 2 and packed >= 1 for wrong, graphs, packed in results), results


def test_the_fused_ops_side_stream_is_never_the_stream_it_forks_from():
    """torch hands out its streams from a pool of 32 per device, round robin, so the stream a graph is captured on
    (a new one per capture) or a user's own stream is, every 32 draws, the fused ops' side stream itself: the
    copies and chunk sums queued there would then wait for the kernels they should run beside."""
    from iris.ops._fused import side_stream

    device = torch.device("cuda", torch.cuda.current_device())
    for _ in range(96):  # three times around the pool
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            assert side_stream(device) != stream
            assert side_stream(device) == side_stream(device)  # the fork's and the join's: one stream


def _new_collectives_replayed():
    """sendrecv around the ring, all_to_all_v with counts rewritten on the device, reduce and gather, captured
    once and replayed: each replay moves the data written before it (the counts included)."""
    ctx = iris.iris(1 << 22)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    mine, theirs = ctx.zeros(4096), ctx.zeros(4096)
    x = ctx.zeros((8 * world, 16))
    out = torch.zeros(8 * world, 16, device=device)
    splits = torch.zeros(world, dtype=torch.int64, device=device)
    received = torch.zeros(world, dtype=torch.int64, device=device)
    total = ctx.zeros(4096)
    gathered = ctx.zeros(world * 4096)
    stream = torch.cuda.Stream()

    def step():
        ctx.ccl.sendrecv(mine, theirs, dst=(rank + 1) % world, src=(rank - 1) % world)
        ctx.ccl.all_to_all_v(out, x, splits, recv_counts=received)
        ctx.ccl.reduce(total, mine, dst=0)
        ctx.ccl.gather(gathered, mine, dst=world - 1)

    def fill(replay):
        mine.fill_(100 * replay + rank)
        splits.fill_(1 + replay % 8)
        x.copy_((1000 * replay + 100 * rank + torch.arange(8 * world * 16, device=device)).float().view(8 * world, 16))

    ctx.barrier()
    with torch.cuda.stream(stream):
        fill(0)
        step()  # uncaptured: compiles, allocates the kept workspaces
    stream.synchronize()
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    torch.cuda.synchronize()
    ctx.barrier()
    wrong = []
    for replay in range(1, 6):
        fill(replay)
        torch.cuda.synchronize()
        ctx.barrier()
        graph.replay()
        torch.cuda.synchronize()
        if theirs.unique().tolist() != [float(100 * replay + (rank - 1) % world)]:
            wrong.append(("sendrecv", replay))
        k = 1 + replay % 8
        if received.tolist() != [k] * world:
            wrong.append(("all_to_all_v counts", replay, received.tolist()))
        want = torch.cat([1000 * replay + 100 * src + torch.arange(rank * k * 16, (rank + 1) * k * 16).float()
                          for src in range(world)]).view(-1, 16)
        if not torch.equal(out[:k * world].cpu(), want):
            wrong.append(("all_to_all_v rows", replay))
        if rank == 0 and total.unique().tolist() != [float(sum(100 * replay + r for r in range(world)))]:
            wrong.append(("reduce", replay))
        if rank == world - 1 and gathered.view(world, -1)[:, 0].tolist() != [100.0 * replay + r for r in range(world)]:
            wrong.append(("gather", replay))
        ctx.barrier()
    ctx.close()
    return wrong


def test_send_recv_all_to_all_v_reduce_and_gather_replay_from_a_graph(ranks):
    assert ranks.run(_new_collectives_replayed) == [[]] * ranks.world_size


def _moe_replays(replays):
    """MoE dispatch + combine captured once (max_tokens fixed) and replayed with new routing each time: per replay,
    (rows grouped right for every local expert, combine's relative error)."""
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    hidden, per_rank, k, tokens = 32, 2, 2, 8
    experts = per_rank * world
    moe = ctx.ccl.moe_dispatcher(hidden_dim=hidden, num_experts=experts, topk=k, max_tokens=tokens,
                                 dtype=torch.float32)

    def routing(replay, source):
        g = torch.Generator().manual_seed(replay * 100 + source)
        idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
        return torch.randn(tokens, hidden, generator=g), idx, torch.rand(tokens, k, generator=g)

    x, idx, w = (t.to(device) for t in routing(0, rank))
    stream = torch.cuda.Stream()

    def step():
        recv, meta, handle = moe.dispatch(x, idx, w)
        return recv, meta.offsets, moe.combine(recv * 2, handle)

    with torch.cuda.stream(stream):
        step()  # uncaptured: compiles the kernels
    stream.synchronize()
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        recv, offsets, y = step()
    torch.cuda.synchronize()
    ctx.barrier()
    results = []
    for replay in range(1, replays + 1):
        data = [routing(replay, source) for source in range(world)]
        for static, new in zip((x, idx, w), data[rank]):
            static.copy_(new)
        ctx.barrier()  # every rank's inputs are in place
        graph.replay()
        torch.cuda.synchronize()
        grouped = True
        for local, expert in enumerate(range(rank * per_rank, (rank + 1) * per_rank)):
            want = [data[s][0][t] for s in range(world) for t in range(tokens) for j in range(k)
                    if int(data[s][1][t, j]) == expert]
            got = recv[int(offsets[local]):int(offsets[local + 1])].cpu()
            grouped &= len(got) == len(want) and torch.equal(got, torch.stack(want))
        xs, ids, ws = data[rank]
        want = 2 * (xs[:, None, :] * ws[:, :, None]).sum(1)
        results.append((grouped, ((y.cpu() - want).norm() / want.norm()).item()))
        ctx.barrier()  # nobody's next replay lands while a peer still checks
    ctx.close()
    return results


def test_moe_dispatch_and_combine_replay_from_a_cuda_graph(ranks):
    """Nothing of dispatch and combine waits on the host or allocates on the heap: captured once, each replay
    routes new tokens (new counts per expert) right."""
    for results in ranks.run(_moe_replays, 4):
        assert all(grouped and error < 1e-5 for grouped, error in results), results


def _layer_replays(replays):
    """A layer's sequence captured once: matmul_all_reduce, all_reduce_rmsnorm (residual in place), a torch copy
    and all_gather; each replay takes new activations and residuals. Per replay, the largest relative error of
    the three results against float64 torch."""
    ctx = iris.iris(1 << 26)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    tokens, k_shard, hidden, eps = 16, 64, 256, 1e-6

    def inputs(replay, source):
        g = torch.Generator().manual_seed(1000 * replay + source)
        return torch.randn(tokens, k_shard, generator=g), torch.randn(tokens, hidden, generator=g)

    w_shards = [torch.randn(k_shard, hidden, generator=torch.Generator().manual_seed(7 + s)) / 8 for s in range(world)]
    weight_cpu = torch.rand(hidden, generator=torch.Generator().manual_seed(3)) + 0.5
    w, weight = w_shards[rank].to(device), weight_cpu.to(device)
    x, residual = (t.to(device) for t in inputs(0, rank))
    y = ctx.zeros(tokens, hidden)  # all_reduce_rmsnorm reads every member's partial: on the heap
    normed = torch.empty(tokens, hidden, device=device)
    staged = ctx.zeros(tokens, hidden)
    gathered = ctx.zeros(world * tokens, hidden)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())

    def step():
        ctx.ops.matmul_all_reduce(y, x, w)
        ctx.ccl.all_reduce_rmsnorm(y, residual, weight, eps=eps, out=normed)
        staged.copy_(normed)
        ctx.ccl.all_gather(gathered, staged)

    with torch.cuda.stream(stream):
        step()  # uncaptured: compiles the kernels, makes the workspaces
    stream.synchronize()
    ctx.barrier()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        step()
    torch.cuda.synchronize()
    ctx.barrier()

    def relative(got, want):
        return ((got.cpu().double() - want).norm() / want.norm()).item()

    errors = []
    for replay in range(1, replays + 1):
        data = [inputs(replay, source) for source in range(world)]
        with torch.cuda.stream(stream):
            x.copy_(data[rank][0])
            residual.copy_(data[rank][1])
        stream.synchronize()
        ctx.barrier()  # every rank's inputs are in place
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
        y_want = sum(d[0].double() @ s.double() for d, s in zip(data, w_shards))
        layer = [d[1].double() + world * y_want for d in data]  # each rank's residual after the step
        norms = [r / torch.sqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight_cpu.double() for r in layer]
        errors.append(max(relative(y, y_want), relative(residual, layer[rank]), relative(normed, norms[rank]),
                          relative(gathered, torch.cat(norms))))
        ctx.barrier()  # nobody's next replay lands while a peer still checks
    ctx.close()
    return errors


def test_a_layer_of_fused_ops_and_collectives_replays_from_one_graph_with_new_inputs(ranks):
    """Upstream's graph-capture test, as a layer: fused GEMM + all_reduce, the fused all_reduce + RMSNorm and an
    all_gather captured together, replayed ten times with new inputs (TF32 allowed: 1e-2)."""
    for errors in ranks.run(_layer_replays, 10):
        assert len(errors) == 10 and max(errors) < 1e-2, errors
