"""Heap providers (iris.memory.providers): which one a context takes, and what each refuses, before any heap.

The ``ipc`` provider is the backend's own mapping of peers' memory (CUDA/HIP IPC, POSIX shared memory
on the CPU backend); ``shmem`` is one NVSHMEM/rocSHMEM symmetric allocation made through torch's
symmetric memory. The CPU backend has no shmem engine (a row of the capability table), so here the
shmem provider is exercised for its choice and refusals; its allocation runs on a GPU (the last test).
"""

import os
import time

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.runtime.capabilities import limitation
from iris.device import nvshmem as engine
from iris.memory.providers import PROVIDERS, JobFacts, create_provider, provider_name
from iris.runtime import SELECTED


def _facts(**changes):
    facts = dict(backend="cuda", nodes=(0, 0), devices=("cuda:0", "cuda:1"), distributed=True, engine=(True, True))
    facts.update(changes)
    return JobFacts(**facts)


def test_the_provider_is_the_argument_else_iris_heap_else_ipc(monkeypatch):
    monkeypatch.delenv("IRIS_HEAP", raising=False)
    assert provider_name(None) == "ipc"
    monkeypatch.setenv("IRIS_HEAP", "SHMEM")
    assert provider_name(None) == "shmem"
    assert provider_name("ipc") == "ipc"  # the argument wins over the variable
    monkeypatch.setenv("IRIS_HEAP", "nvlink")
    with pytest.raises(ValueError, match="IRIS_HEAP='nvlink'.*ipc, shmem"):
        provider_name(None)
    with pytest.raises(ValueError, match="heap='rdma'.*ipc, shmem"):
        provider_name("rdma")
    assert PROVIDERS == ("ipc", "shmem")


def test_the_ipc_heap_refuses_ranks_on_several_nodes_and_takes_any_one_node():
    ipc = create_provider("ipc")
    assert ipc.refusal(_facts()) is None
    assert ipc.refusal(_facts(backend="cpu", devices=("cpu", "cpu"))) is None
    assert ipc.refusal(_facts(devices=("cuda:0", "cuda:0"))) is None  # simulation: ranks share a GPU
    message = ipc.refusal(_facts(nodes=(0, 1)))
    assert "2 nodes" in message and "(0, 1)" in message and "inside one node" in message, message


def test_the_shmem_heap_says_why_it_cannot_run_before_any_allocation():
    shmem = create_provider("shmem")
    assert shmem.refusal(_facts()) is None
    assert shmem.refusal(_facts(backend="hip")) is None
    cpu = shmem.refusal(_facts(backend="cpu", devices=("cpu", "cpu")))
    assert limitation("cpu", "shmem_heap") in cpu and "heap='ipc'" in cpu, cpu
    alone = shmem.refusal(_facts(distributed=False))
    assert "torch.distributed" in alone and "iris run" in alone, alone
    missing = shmem.refusal(_facts(engine=(True, False)))
    assert "rank 1" in missing and "NVSHMEM" in missing, missing
    assert shmem.refusal(_facts(nodes=(0, 1))) is None  # NVIDIA: the engine path reaches the other node
    across = shmem.refusal(_facts(backend="hip", nodes=(0, 1)))
    assert "2 nodes" in across and "rocSHMEM" in across and "docs/multi-node.md" in across, across


def test_the_shmem_heap_puts_ranks_on_one_gpu_only_under_mps_shares_that_fit():
    """NVSHMEM runs several processes per GPU only under CUDA MPS with thread shares summing to <= 100."""
    shmem = create_provider("shmem")
    one_gpu = dict(devices=("cuda:0", "cuda:0", "cuda:1"), nodes=(0, 0, 0), engine=(True,) * 3)
    unset = shmem.refusal(_facts(**one_gpu))
    assert "ranks 0, 1 on cuda:0" in unset and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" in unset, unset
    assert "rank 1: unset" in unset and "set it to 50" in unset and "heap='ipc'" in unset, unset
    too_much = shmem.refusal(_facts(**one_gpu, mps_shares=(60.0, 50.0, None)))
    assert "rank 0: 60.0, rank 1: 50.0" in too_much, too_much
    assert shmem.refusal(_facts(**one_gpu, mps_shares=(50.0, 50.0, None))) is None  # cuda:1 has one rank


def test_a_rank_on_another_node_gets_base_zero_so_kernels_reach_it_through_the_engine():
    from iris.memory.providers.shmem import far_bases

    pointers = [0x1000, 0x2000, 0x3000, 0x4000]
    assert far_bases(pointers, (0, 0, 1, 1), 0) == [0x1000, 0x2000, 0, 0]
    assert far_bases(pointers, (0, 0, 1, 1), 3) == [0, 0, 0x3000, 0x4000]
    assert far_bases(pointers, (0, 1, 0, 1), 1) == [0, 0x2000, 0, 0x4000]
    assert far_bases([0x1000, 0], (0, 0), 0) == [0x1000, 0]  # a peer the engine maps no pointer to stays 0


def test_a_shmem_heap_larger_than_the_free_memory_is_refused_before_the_engine_allocates():
    # NVSHMEM ends the process (exit 255) when it cannot back its heap; the check comes first, with numbers
    from iris.memory.providers.shmem import size_refusal

    message = size_refusal(1 << 50, free=80 << 30, total=141 << 30, device="cuda:1")
    assert str(1 << 50) in message and f"{80 << 30} of {141 << 30} bytes free" in message and "cuda:1" in message
    assert size_refusal(1 << 30, free=80 << 30, total=141 << 30, device="cuda:1") is None


def _no_segment_stays_beyond(before) -> bool:
    """Whether every shared-memory segment that was not in ``before`` is gone within 2 s: a heap's segments are
    unlinked once mapped, so another test's job (pytest-xdist) shows one only for a moment; a leak stays."""
    for _ in range(20):
        if set(os.listdir("/dev/shm")) <= set(before):
            return True
        time.sleep(0.1)
    return False


def _context_with_heap(heap, variable):
    """iris.iris() with heap=heap and IRIS_HEAP=variable (None: unset): the provider taken, or the error."""
    saved = os.environ.pop("IRIS_HEAP", None)
    if variable is not None:
        os.environ["IRIS_HEAP"] = variable
    before = sorted(os.listdir("/dev/shm"))
    try:
        ctx = iris.iris(1 << 16, heap=heap) if heap is not None else iris.iris(1 << 16)
        found = ctx.get_heap_provider()
        x = ctx.full((4,), ctx.get_rank() + 7, dtype=torch.int32)
        assert x.tolist() == [ctx.get_rank() + 7] * 4
        ctx.close()
        return found
    except (RuntimeError, ValueError) as exc:
        return type(exc).__name__, str(exc), _no_segment_stays_beyond(before)
    finally:
        os.environ.pop("IRIS_HEAP", None)
        if saved is not None:
            os.environ["IRIS_HEAP"] = saved


@pytest.mark.skipif(SELECTED != "cpu", reason="the CPU backend's refusal of the shmem heap; GPUs take it")
def test_contexts_take_the_chosen_provider_and_refuse_shmem_on_every_rank_on_the_cpu(ranks):
    world = ranks.world_size
    assert ranks.run(_context_with_heap, None, None) == ["ipc"] * world
    assert ranks.run(_context_with_heap, "ipc", "shmem") == ["ipc"] * world
    for answers in (ranks.run(_context_with_heap, "shmem", None), ranks.run(_context_with_heap, None, "shmem")):
        for kind, message, nothing_left in answers:
            assert kind == "HeapProviderRefusal" and "heap='shmem'" in message and "CPU backend" in message, message
            assert nothing_left, "a refused heap left a shared-memory segment behind"
    for kind, message, _ in ranks.run(_context_with_heap, "rdma", None):
        assert kind == "ValueError" and "heap='rdma'" in message, message


def _context_across_nodes(world):
    os.environ["IRIS_NODE_MAP"] = ",".join(str(r % 2) for r in range(world))
    try:
        return _context_with_heap("ipc", None)
    finally:
        del os.environ["IRIS_NODE_MAP"]


def test_a_context_names_its_provider_in_the_error_of_a_job_across_nodes(ranks):
    for kind, message, _ in ranks.run(_context_across_nodes, ranks.world_size):
        assert kind == "HeapProviderRefusal" and "heap='ipc'" in message and "inside one node" in message, message


@pytest.mark.skipif(limitation(SELECTED, "shmem_heap") is not None,
                    reason=str(limitation(SELECTED, "shmem_heap")))
def test_a_shmem_heap_of_one_rank_holds_data_and_bases_on_a_gpu(tmp_path):
    """One rank, in this process: torch.distributed of one, then an NVSHMEM heap through torch."""
    import torch.distributed as dist

    from shared_kernels import put_block_kernel

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    ctx = iris.iris(1 << 20, heap="shmem")
    try:
        assert ctx.get_heap_provider() == "shmem"
        assert int(ctx.get_heap_bases()[0]) == ctx.heap.base
        src = ctx.empty(1000, dtype=torch.int32)
        src.copy_(torch.randint(-1000, 1000, (1000,), dtype=torch.int32))
        dst = ctx.full((1000,), -1, dtype=torch.int32)
        put_block_kernel[(4,)](src, dst, 1000, 0, 0, ctx.get_heap_bases(), BLOCK=256)
        ctx.barrier()
        assert torch.equal(dst, src)
    finally:
        ctx.close()
        dist.destroy_process_group()


@pytest.mark.skipif(limitation(SELECTED, "shmem_heap") is not None,
                    reason=str(limitation(SELECTED, "shmem_heap")))
def test_the_engines_device_calls_reach_the_shmem_heap_beside_iris_ops(tmp_path):
    """What the path across nodes will stand on: the shmem heap is the engine's symmetric memory, so a
    kernel's NVSHMEM put (torch's Triton bindings) lands in heap tensors, beside Iris's own loads in the
    same kernel. One rank, to itself."""
    import torch.distributed as dist
    import triton
    import triton.language as tl

    nvshmem = pytest.importorskip("torch.distributed._symmetric_memory._nvshmem_triton")

    @nvshmem.requires_nvshmem
    @triton.jit
    def iris_load_then_engine_put(dst, src, n, pe, heap_bases, BLOCK: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        tl.store(src + BLOCK + offs, iris.load(src + offs, 0, 0, heap_bases) * 2)
        nvshmem.put(dst, src + BLOCK, n, pe)
        nvshmem.quiet()

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    ctx = iris.iris(1 << 20, heap="shmem")
    try:
        src = ctx.empty(2048, dtype=torch.float32)
        src[:1024].copy_(torch.randn(1024))
        dst = ctx.zeros(1024, dtype=torch.float32)
        iris_load_then_engine_put[(1,)](dst, src, 1024, 0, ctx.get_heap_bases(), BLOCK=1024)
        ctx.barrier()
        assert torch.equal(dst, src[:1024] * 2)
    finally:
        ctx.close()
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_engine_path_compiles_for_sm_90_with_nvshmem_linked(tmp_path):
    """Every device op with the engine path compiled in (a job across nodes), compiled for an H100/H200 on
    this machine, NVSHMEM's device library linked: what the cross-compile gate cannot see, since it
    compiles with the path off. In a process of its own: the switch holds for a whole process."""
    import subprocess
    import sys

    nvshmem = pytest.importorskip("torch.distributed._symmetric_memory._nvshmem_triton")
    try:
        nvshmem.NvshmemLibFinder.find_device_library()
    except RuntimeError as exc:
        pytest.skip(f"NVSHMEM's device library is not installed here (a torch wheel without CUDA): {exc}")
    script = os.path.join(os.path.dirname(__file__), "engine_compile_check.py")
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_BACKEND")}
    env["IRIS_ENGINE_CACHE"] = str(tmp_path / "engine")  # the library cut afresh, by this Triton
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=600, env=env,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "every_op compiled for sm_90" in done.stdout and "True" in done.stdout, done.stdout
    assert "barrier_kernel compiled for sm_90" in done.stdout and "bools compiled" in done.stdout, done.stdout
    assert "the cut library gives the same PTX as the whole one" in done.stdout, done.stdout
    assert "with block reads toward other nodes" in done.stdout and "with block writes" in done.stdout, done.stdout
    assert "_all_reduce_ll_kernel compiled for sm_90 with 8-byte puts" in done.stdout, done.stdout


def test_a_linked_module_that_is_not_as_expected_is_not_taken_for_the_cut_library():
    from iris.memory.providers.engine_library import PROBE, _cut

    probe = f"define ptx_kernel void @{PROBE}(i64 %0) {{\n  call void @f(i64 %0)\n  ret void\n}}\n"
    helper = "define internal void @f(i64 %0) {\n  ret void\n}\n"
    assert _cut(probe + helper, ("f",)) == "define void @f(i64 %0) {\n  ret void\n}\n"
    assert _cut(probe + helper, ("f", "nvshmem_quiet")) is None  # a symbol the engine calls is missing
    assert _cut(helper, ("f",)) is None  # no probe kernel: not the module we made
    assert _cut(probe + helper + f"!0 = !{{ptr @{PROBE}}}\n", ("f",)) is None  # still referenced


def _collective_frees_on_rank(world):
    """Each rank holds three allocations, views and releases them unevenly, and frees collectively."""
    import weakref

    from iris.runtime.distributed import init_distributed
    from iris.memory.collective_free import CollectiveFrees

    comm = init_distributed("cpu", lambda rank: torch.device("cpu"))
    frees = CollectiveFrees()
    made = [torch.full((64,), float(i)) for i in range(3)]
    alive = [weakref.ref(t.untyped_storage()) for t in made]
    entries = [frees.keep(t) for t in made]
    del made
    views = [entry.view() for entry in entries]
    steps = []
    entries[0].released = True
    entries[2].released = True
    if comm.rank == 1:
        entries[2].released = False  # one rank's context is still open: nobody may free it yet
    steps.append(frees.free_unused(comm))  # views alive everywhere: nothing freed
    views[0] = views[2] = None
    steps.append(frees.free_unused(comm))  # only the first: the third is still held by rank 1
    after_first = [ref() is None for ref in alive]
    entries[2].released = True
    steps.append(frees.free_unused(comm))
    after_third = [ref() is None for ref in alive]
    assert float(views[1][5]) == 1.0  # the one still viewed keeps its data
    frees.keep_at_exit()
    return steps, after_first, after_third, [len(frees.entries)]


def test_a_collectively_freed_allocation_is_freed_on_every_rank_at_once_and_only_when_unused_everywhere(ranks):
    """The shmem heap's memory is freed by a collective call (NVSHMEM's free waits for every rank), never by
    the garbage collector on one rank: these are real tensors and a real torch.distributed group."""
    for steps, after_first, after_third, left in ranks.run(_collective_frees_on_rank, ranks.world_size):
        assert steps == [0, 1, 1], steps
        assert after_first == [True, False, False] and after_third == [True, False, True], (after_first, after_third)
        assert left == [1]


def test_memory_never_freed_outlives_its_last_name_and_a_garbage_collection():
    """never_free: what a collective free cannot pair up (an allocation some ranks made, the engine's
    memory at exit, benchmarks/ccl.py's torch symmetric buffer) stays alive with no name left."""
    import gc
    import weakref

    from iris.memory.collective_free import never_free

    kept, dropped = torch.ones(8), torch.ones(8)
    kept_ref, dropped_ref = weakref.ref(kept), weakref.ref(dropped)
    never_free(kept)
    del kept, dropped
    gc.collect()
    assert dropped_ref() is None and kept_ref() is not None and float(kept_ref().sum()) == 8.0


@triton.jit
def _run_of_case(remote, local, outside, out, heap_bases, CASE: tl.constexpr):
    """engine._run on one pattern of lanes (the block transfers' test of what is one run)."""
    offs = tl.arange(0, 16)
    cur = iris.current_rank(heap_bases)
    lanes = offs >= 0
    far = remote + offs
    near = local + offs
    rank = cur
    if CASE == "prefix":
        lanes = offs < 5
    elif CASE == "middle":
        lanes = (offs >= 3) & (offs < 9)
    elif CASE == "hole":
        lanes = offs != 4
    elif CASE == "strided":
        far = remote + 2 * offs
    elif CASE == "reversed":
        near = local + 15 - offs
    elif CASE == "outside_heap":
        near = outside + offs
    elif CASE == "none":
        lanes = offs < 0
    elif CASE == "two_ranks":
        rank = cur + offs % 2
    if CASE == "rows":  # a 4 x 4 tile of whole rows: one run
        tile = tl.arange(0, 4)[:, None] * 4 + tl.arange(0, 4)[None, :]
        ok, r, loc, nbytes, pe = engine._run(remote + tile, local + tile, cur, cur, heap_bases, tile >= 0)
    elif CASE == "gapped_rows":  # rows 8 apart: not one run
        tile = tl.arange(0, 4)[:, None] * 8 + tl.arange(0, 4)[None, :]
        ok, r, loc, nbytes, pe = engine._run(remote + tile, local + tile, cur, cur, heap_bases, tile >= 0)
    else:
        ok, r, loc, nbytes, pe = engine._run(far, near, rank, cur, heap_bases, lanes)
    tl.store(out + 0, ok.to(tl.int64))
    tl.store(out + 1, r - remote.to(tl.int64))
    tl.store(out + 2, loc - local.to(tl.int64))
    tl.store(out + 3, nbytes)
    tl.store(out + 4, pe.to(tl.int64))


@pytest.mark.parametrize("case, expected", [
    ("all", (1, 0, 0, 64)), ("prefix", (1, 0, 0, 20)), ("middle", (1, 12, 12, 24)), ("rows", (1, 0, 0, 64)),
    ("hole", (0,)), ("strided", (0,)), ("reversed", (0,)), ("outside_heap", (0,)), ("none", (0,)),
    ("two_ranks", (0,)), ("gapped_rows", (0,)),
])
def test_block_transfers_take_only_lanes_that_are_one_run_inside_the_heap(case, expected):
    """What the engine moves as one putmem/getmem (iris.put/get toward another node): the selected lanes
    are consecutive elements in lane order on both sides, toward one rank, the local side in the heap.
    The engine's calls need a GPU; which lanes form a run is plain Triton, checked here."""
    got, rank = _outputs_of_case(_run_of_case, case, 5)
    assert tuple(got[: len(expected)]) == expected, (case, got)
    if expected[0]:
        assert got[4] == rank


def _outputs_of_case(kernel, case: str, outputs: int) -> tuple[list, int]:
    """Run a case kernel on two heap buffers and one outside the heap; its int64 outputs and this rank."""
    ctx = iris.iris(1 << 16)
    remote, local = ctx.zeros(64, dtype=torch.int32), ctx.zeros(64, dtype=torch.int32)
    outside = torch.zeros(64, dtype=torch.int32, device=remote.device)  # not in the heap
    out = torch.full((outputs,), -1, dtype=torch.int64, device=remote.device)
    kernel[(1,)](remote, local, outside, out, ctx.get_heap_bases(), CASE=case)
    got, rank = out.cpu().tolist(), ctx.get_rank()
    ctx.close()
    return got, rank


@triton.jit
def _row_runs_of_case(remote, local, outside, out, heap_bases, CASE: tl.constexpr):
    """engine._row_runs on a 4 x 4 tile of a row-major matrix 8 wide (rows 32 bytes apart), one pattern
    of lanes per case (what a 2-D iris.put/get toward another node moves with one call per row)."""
    rows = tl.arange(0, 4)[:, None]
    columns = tl.arange(0, 4)[None, :]
    cur = iris.current_rank(heap_bases)
    lanes = (rows >= 0) & (columns >= 0)
    far = remote + rows * 8 + columns
    near = local + rows * 8 + columns
    rank = cur + rows * 0
    if CASE == "left_columns":
        lanes = lanes & (columns < 2)
    elif CASE == "top_rows":
        lanes = lanes & (rows < 2)
    elif CASE == "reversed_rows":  # rows in any order: each its own call
        far = remote + (3 - rows) * 8 + columns
    elif CASE == "hole":
        lanes = lanes & ((rows != 1) | (columns != 2))
    elif CASE == "strided_columns":
        far = remote + rows * 8 + 2 * columns
    elif CASE == "two_ranks":
        rank = cur + rows % 2
    elif CASE == "outside_heap":
        near = outside + rows * 8 + columns
    elif CASE == "none":
        lanes = lanes & (rows < 0)
    ok, far_rows, near_rows, row_bytes, pe = engine._row_runs(far, near, rank, cur, heap_bases, lanes)
    tl.store(out + 0, ok.to(tl.int64))
    tl.store(out + 1 + tl.arange(0, 4), far_rows - remote.to(tl.int64))
    tl.store(out + 5 + tl.arange(0, 4), near_rows - local.to(tl.int64))
    tl.store(out + 9 + tl.arange(0, 4), row_bytes)
    tl.store(out + 13, pe.to(tl.int64))


@pytest.mark.parametrize("case, expected", [
    ("all", (1, 0, 32, 64, 96, 0, 32, 64, 96, 16, 16, 16, 16)),
    ("left_columns", (1, 0, 32, 64, 96, 0, 32, 64, 96, 8, 8, 8, 8)),
    ("top_rows", (1, 0, 32) + (None,) * 2 + (0, 32) + (None,) * 2 + (16, 16, 0, 0)),
    ("reversed_rows", (1, 96, 64, 32, 0, 0, 32, 64, 96, 16, 16, 16, 16)),
    ("hole", (0,)), ("strided_columns", (0,)), ("two_ranks", (0,)), ("outside_heap", (0,)), ("none", (0,)),
])
def test_block_transfers_of_a_tile_take_one_run_per_row(case, expected):
    """A tile of a wider matrix is not one run, but each of its rows is: the engine then moves it with one
    putmem/getmem per row (a row without lanes: none), if every row's lanes are one run toward one rank
    with the local side in the heap; anything else goes element by element."""
    got, rank = _outputs_of_case(_row_runs_of_case, case, 14)
    assert all(want is None or want == seen for want, seen in zip(expected, got)), (case, got)
    if expected[0]:
        assert got[13] == rank


def test_a_heap_the_engine_may_reach_lays_out_the_staging_slots_just_below_the_scratch_word():
    """Block reads toward another node land in a staging slot of the reader's heap; the engine finds the
    slots and their lock words from the scratch word's address, so they must lie right below it. Every heap
    of a provider that may compile the engine path has them (the shmem heap compiles it wherever the
    engine maps no pointer to a rank, on one node too); the ipc heap, which never does, reserves none."""
    from iris.host.team import reserved_layout

    assert create_provider("shmem").reaches_by_engine and not create_provider("ipc").reaches_by_engine
    for world in (1, 2, 3, 8):
        layout = reserved_layout(world, engine_path=True)
        staging, slots, _ = layout.place("engine.staging")
        locks, words, _ = layout.place("engine.staging_locks")
        scratch, _, _ = layout.place("engine.scratch")
        assert words == engine.STAGING_SLOTS
        assert locks + 4 * words == scratch, (world, locks, scratch)
        assert staging + 8 * slots == locks and 8 * slots == engine.STAGING_SLOTS * engine.STAGING_BYTES
        inside = reserved_layout(world)
        assert "engine.staging" not in inside and "engine.staging_locks" not in inside
        assert inside.nbytes + 8 * slots + 4 * words == layout.nbytes


@triton.jit
def _take_slots(locks, got, starts, HOLD: tl.constexpr, TAKES: tl.constexpr):
    """Each program takes TAKES staging slots from its start on, records them, and gives them back unless HOLD."""
    for i in range(TAKES):
        slot = engine.acquire_slot(locks, tl.load(starts + tl.program_id(0)))
        tl.store(got + tl.program_id(0) * TAKES + i, slot)
        if not HOLD:
            engine.release_slot(locks, slot)


def test_a_staging_slot_is_the_first_free_one_from_the_start_and_comes_back_after_use():
    """The staging slots' locks (plain Triton atomics, run here): a program takes the first free slot from
    its start on, wrapping past the last; slots held are skipped; a slot given back is free again; programs
    holding slots at once (on a GPU, concurrently) never share one."""
    device = "cpu" if SELECTED == "cpu" else "cuda"
    count = engine.STAGING_SLOTS.value
    locks = torch.zeros(count, dtype=torch.int32, device=device)
    locks[[5, 6, count - 1]] = 1  # held by other programs
    for start, first_free in ((5, 7), (count - 1, 0), (0, 0), (2 * count + 6, 7)):  # one program at a time
        got = torch.full((3,), -1, dtype=torch.int32, device=device)
        _take_slots[(1,)](locks, got, torch.tensor([start], dtype=torch.int32, device=device), HOLD=False, TAKES=3)
        assert got.tolist() == [first_free] * 3, (start, got)
    assert locks.nonzero().flatten().tolist() == [5, 6, count - 1]  # every slot taken here given back
    starts = torch.tensor([5, 5, count - 1, 7, 0, 3, 5, 6], dtype=torch.int32, device=device)
    got = torch.full((8 * 2,), -1, dtype=torch.int32, device=device)
    _take_slots[(8,)](locks, got, starts, HOLD=True, TAKES=2)  # held: the next take goes on
    taken = got.tolist()
    assert len(set(taken)) == 16 and not {5, 6, count - 1} & set(taken), taken
    assert sorted(locks.nonzero().flatten().tolist()) == sorted(taken + [5, 6, count - 1])
    if SELECTED == "cpu":  # programs one after another: each takes the next free slots
        assert taken[:4] == [7, 8, 9, 10], taken


@pytest.mark.slow
@pytest.mark.skipif(SELECTED != "cpu", reason="needs a backend that refuses heap='shmem' for every job (the CPU's)")
def test_a_test_the_heap_provider_asked_for_refuses_is_skipped_with_its_reason(tmp_path):
    """`IRIS_HEAP=shmem pytest tests`: a test whose job the provider cannot serve (here: any, on the CPU backend)
    is skipped with the provider's refusal as the reason, whether the context is made in the test's process,
    on the rank pool's processes or under `iris run` (iris.testing.heap_refusals); a refusal of a provider the
    test itself asked for, with IRIS_HEAP unset, stays a failure."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # (-m "" and IRIS_TEST_WORLDS=2,4: every tier, so the 4-rank case and the slow example test run too)
    cases = ["tests/test_errors.py::test_out_must_match",                       # in the test's process
             "tests/test_host_api.py::test_identity_and_heap_bases",           # the rank pool, 2 and 4 ranks
             "tests/test_examples.py::test_example_validates_on_two_ranks[01_store]"]  # under `iris run`
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"IRIS_TEST_WORLDS": "2,4"}

    def pytest_run(*args, heap):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-m", "", "-p", "no:cacheprovider", *args],
                              cwd=root,
                              capture_output=True, text=True, timeout=600, env=env | {"IRIS_HEAP": heap})

    proc = pytest_run(*cases, heap="shmem")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "4 skipped" in out and "failed" not in out, out[-3000:]
    assert out.count("IRIS_HEAP=shmem: heap='shmem' cannot run on the CPU backend") == 3, out[-3000:]  # -rs groups
    own = tmp_path / "test_own.py"
    own.write_text("import iris\n\ndef test_asks_for_shmem():\n    iris.iris(1 << 16, heap='shmem')\n")
    proc = pytest_run("-p", "iris.testing.heap_refusals", str(own), heap="")
    assert proc.returncode == 1 and "1 failed" in proc.stdout and "HeapProviderRefusal" in proc.stdout, proc.stdout
