"""Programs written for the original (``device="cuda"``, ``torch.cuda.set_device``, events, streams,
``init_process_group(backend="nccl")``) run unchanged on the CPU backend (iris.runtime.cuda_on_cpu), and
IRIS_CPU_CUDA=0 gives torch's own behaviour back.

The in-process tests run where this process has the stand-in (the CPU backend on a machine without a
GPU); on a GPU, a test checks that nothing of torch was touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris import config
from iris.runtime import cuda_on_cpu

STAND_IN = cuda_on_cpu.installed()
needs_stand_in = pytest.mark.skipif(not STAND_IN, reason="the CUDA stand-in is on only on the CPU backend without "
                                                         "a GPU (and without IRIS_CPU_CUDA=0)")


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter on the CPU backend, with ``env`` added."""
    environment = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_CPU_CUDA")}
    environment.update(IRIS_BACKEND="cpu", **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environment, capture_output=True,
                          text=True, timeout=120)


def test_on_exactly_where_it_should_be():
    """On by default on the CPU backend where torch sees no GPU; never on a GPU backend or where torch sees one."""
    expected = iris.runtime.SELECTED == "cpu" and not torch.cuda.is_available() and config.cpu_cuda()
    assert STAND_IN == expected
    if not STAND_IN:
        assert not cuda_on_cpu.installed() and torch.cuda.Event.__module__.startswith("torch")


@pytest.mark.parametrize("value, on", [("", True), ("1", True), ("on", True), ("0", False), ("false", False)])
def test_the_switch(monkeypatch, value, on):
    monkeypatch.setenv("IRIS_CPU_CUDA", value)
    assert config.cpu_cuda() is on


def test_the_switch_refuses_a_typo(monkeypatch):
    monkeypatch.setenv("IRIS_CPU_CUDA", "maybe")
    with pytest.raises(ValueError, match="IRIS_CPU_CUDA='maybe'"):
        config.cpu_cuda()


@needs_stand_in
def test_device_cuda_means_the_cpu():
    made = [
        torch.zeros(2, device="cuda"), torch.randn(3, device="cuda:1"), torch.ones(2, device=torch.device("cuda", 1)),
        torch.arange(4, device=0), torch.tensor([1, 2], device="cuda"), torch.empty_like(torch.ones(2), device="cuda"),
        torch.ones(2).new_zeros(3, device="cuda"), torch.ones(2).cuda(), torch.ones(2).cuda(1),
        torch.ones(2).to("cuda"), torch.ones(2).to(device="cuda:0"), torch.full((2,), 7.0, device="cuda"),
        torch.empty(2, device="cuda", pin_memory=True),
    ]
    assert [t.device.type for t in made] == ["cpu"] * len(made)
    half = torch.ones(2).to(torch.device("cuda", 0), torch.float16)
    assert half.device.type == "cpu" and half.dtype == torch.float16
    assert torch.ones(2).to(torch.int32).dtype == torch.int32  # a dtype alone is still a dtype
    x = torch.arange(3.0)
    assert x.cuda() is x and x.pin_memory() is x


@needs_stand_in
def test_default_device_cuda():
    torch.set_default_device("cuda")
    try:
        assert torch.zeros(2).device.type == "cpu"
    finally:
        torch.set_default_device(None)


@needs_stand_in
def test_set_device_and_current_device():
    before = torch.cuda.current_device()
    try:
        torch.cuda.set_device(1)
        assert torch.cuda.current_device() == 1
        torch.cuda.set_device(torch.device("cuda", 0))
        assert torch.cuda.current_device() == 0
        torch.cuda.set_device("cuda:3")
        with torch.cuda.device(2):
            assert torch.cuda.current_device() == 2
        assert torch.cuda.current_device() == 3
    finally:
        torch.cuda.set_device(before)


@needs_stand_in
def test_events_time_host_work():
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with pytest.raises(RuntimeError, match="record"):
        start.elapsed_time(end)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    assert end.query() and 40 <= start.elapsed_time(end) < 5000
    untimed = torch.cuda.Event()
    untimed.record()
    with pytest.raises(RuntimeError, match="enable_timing"):
        untimed.elapsed_time(end)


@needs_stand_in
def test_streams_run_in_order():
    default = torch.cuda.current_stream()
    assert default is torch.cuda.default_stream() and default == torch.cuda.current_stream(0)
    side = torch.cuda.Stream()
    assert side != default
    x = torch.zeros(4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        assert torch.cuda.current_stream() is side
        x += 1
        event = side.record_event()
        x.record_stream(side)
    assert torch.cuda.current_stream() is default
    default.wait_event(event)
    default.wait_stream(side)
    side.synchronize()
    assert side.query() and event.query() and x.tolist() == [1.0] * 4
    with torch.cuda.stream(None):  # None: the current stream stays
        assert torch.cuda.current_stream() is default


@needs_stand_in
def test_the_host_answers_for_the_device():
    assert torch.cuda.is_available() is False and torch.cuda.device_count() == 0
    assert "CPU" in torch.cuda.get_device_name() and "CPU" in torch.cuda.get_device_name(1)
    props = torch.cuda.get_device_properties(0)
    assert props.multi_processor_count >= 1 and props.total_memory > 0 and "CPU" in props.name
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total
    torch.cuda.synchronize()
    torch.cuda.synchronize(0)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.memory_allocated() == 0 and torch.cuda.max_memory_allocated() == 0
    assert torch.cuda.is_current_stream_capturing() is False
    torch.cuda.nvtx.range_push("phase")
    torch.cuda.nvtx.range_pop()


@needs_stand_in
def test_what_the_cpu_cannot_give_names_the_call():
    with pytest.raises(RuntimeError, match=r"torch\.cuda\.CUDAGraph.*IRIS_CPU_CUDA"):
        torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match=r"torch\.cuda\.graph"):
        torch.cuda.graph(None)
    with pytest.raises(RuntimeError, match=r"torch\.cuda\.get_device_capability\(\).*CPU backend"):
        torch.cuda.get_device_capability()
    with pytest.raises((RuntimeError, AssertionError), match=r"torch\.cuda\.get_rng_state\(\): it needs a GPU"):
        torch.cuda.get_rng_state()  # not served: torch's own refusal (its exception type), naming the call


@needs_stand_in
def test_nccl_means_gloo():
    assert cuda_on_cpu.host_backend("nccl") == "gloo"
    assert cuda_on_cpu.host_backend("NCCL") == "gloo"
    assert cuda_on_cpu.host_backend("cpu:gloo,cuda:nccl") == "gloo"
    assert cuda_on_cpu.host_backend("gloo") == "gloo" and cuda_on_cpu.host_backend(None) is None
    assert cuda_on_cpu.host_backend("mpi") == "mpi"


@triton.jit
def _push(src, dst, n, me: tl.constexpr, peer: tl.constexpr, BLOCK: tl.constexpr, heap_bases):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    iris.put(src + offsets, dst + offsets, me, peer, heap_bases, mask=offsets < n)


def _the_original_way_on_rank(n):
    """A rank's work written for CUDA: set_device, device="cuda" (three spellings), a stream, timing events."""
    shmem = iris.iris(1 << 20)
    rank, world = shmem.get_rank(), shmem.get_num_ranks()
    torch.cuda.set_device(rank)
    src = shmem.zeros(n, device="cuda", dtype=torch.int64)
    dst = shmem.full((n,), -1, device="cuda", dtype=torch.int64)
    src.copy_(torch.randint(0, 1 << 40, (n,), device=f"cuda:{rank}"))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    shmem.barrier()
    with torch.cuda.stream(torch.cuda.Stream()):
        start.record()
        _push[(triton.cdiv(n, 64),)](src, dst, n, rank, (rank + 1) % world, 64, shmem.get_heap_bases())
        end.record()
    torch.cuda.synchronize()
    shmem.barrier()
    pushed = [torch.as_tensor(shmem.broadcast(src.cpu() if r == rank else None, src=r)) for r in range(world)]
    sent = pushed[(rank - 1) % world]  # what the previous rank pushed here
    got = dst.to(torch.device("cuda", torch.cuda.current_device())).clone()
    shmem.barrier()
    shmem.close()
    return torch.equal(got, sent), start.elapsed_time(end), torch.cuda.current_device()


@needs_stand_in
def test_rank_work_written_for_cuda(ranks):
    """Each rank puts random int64 to the next one; ``n`` is not a multiple of the block (masked lanes)."""
    for rank, (equal, ms, index) in enumerate(ranks.run(_the_original_way_on_rank, 200)):
        assert equal and ms > 0 and index == rank


@pytest.mark.slow  # a fresh interpreter: the slow tier
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks torch's own refusal where there is no GPU")
def test_off_switch_gives_torch_its_own_behaviour():
    out = _python("""
        import iris, torch
        assert torch.cuda.Event.__module__.startswith("torch"), torch.cuda.Event
        torch.zeros(1, device="cuda")
    """, IRIS_CPU_CUDA="0")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(("RuntimeError", "AssertionError", "torch.AcceleratorError")) and "IRIS" not in last, last


ORIGINAL_STYLE = """
    # Written the original's way: spawned ranks, torch.cuda.set_device, NCCL, device="cuda", events, a stream.
    import socket, sys
    import torch, torch.distributed as dist, torch.multiprocessing as mp
    import triton, triton.language as tl
    import iris


    @triton.jit
    def push(src, dst, n, me: tl.constexpr, peer: tl.constexpr, BLOCK: tl.constexpr, heap_bases):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        iris.put(src + offsets, dst + offsets, me, peer, heap_bases, mask=offsets < n)


    def worker(rank, world, url):
        torch.cuda.set_device(rank)
        dist.init_process_group(backend="nccl", init_method=url, rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
        pair = dist.new_group([0, 1], backend="nccl")
        shmem = iris.iris(1 << 20)
        n = 300
        src = shmem.zeros(n, device="cuda", dtype=torch.int32)
        dst = shmem.zeros(n, device="cuda", dtype=torch.int32)
        src.copy_(torch.arange(n, dtype=torch.int32, device=f"cuda:{rank}") * (rank + 2))
        stream = torch.cuda.Stream()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        shmem.barrier()
        with torch.cuda.stream(stream):
            start.record()
            push[(triton.cdiv(n, 128),)](src, dst, n, rank, (rank + 1) % world, 128, shmem.get_heap_bases())
            end.record()
        torch.cuda.synchronize()
        shmem.barrier()
        peer = (rank - 1) % world
        expected = (torch.arange(n, dtype=torch.int32) * (peer + 2)).cuda()
        assert torch.equal(dst, expected), (rank, dst[:8])
        total = torch.tensor([rank + 1.0], device=torch.device("cuda", torch.cuda.current_device()))
        dist.all_reduce(total, group=pair)
        assert dist.get_backend() == "gloo" and dist.get_backend(pair) == "gloo"
        ms = start.elapsed_time(end)
        assert ms > 0 and total.item() == world * (world + 1) / 2
        print(f"rank {rank} ok on {torch.cuda.get_device_name(rank)} in {ms:.1f} ms", flush=True)
        shmem.barrier()
        dist.destroy_process_group()


    if __name__ == "__main__":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        mp.spawn(worker, args=(2, f"tcp://127.0.0.1:{port}"), nprocs=2, join=True)
"""


@pytest.mark.slow
@pytest.mark.skipif(not STAND_IN, reason="needs the CPU backend without a GPU")
def test_a_program_written_for_the_original_runs_at_two_ranks(tmp_path):
    script = tmp_path / "original_style.py"
    script.write_text(textwrap.dedent(ORIGINAL_STYLE))
    environment = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_CPU_CUDA")}
    out = subprocess.run([sys.executable, str(script)], env=dict(environment, IRIS_BACKEND="cpu"),
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "rank 0 ok on" in out.stdout and "rank 1 ok on" in out.stdout, out.stdout + out.stderr
    # NCCL asked for twice per rank (init_process_group, new_group): gloo, and one warning per rank naming the call
    warned = [line for line in out.stderr.splitlines() if 'init_process_group(backend="nccl") runs on gloo' in line]
    assert len(warned) == 2 and "new_group" not in out.stderr, out.stderr


NEWEST_STYLE = """
    # The newest examples' way: a launcher's LOCAL_RANK, set_device, NCCL, a collective, synchronize.
    import os
    import torch, torch.distributed as dist
    import iris

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl")
    shmem = iris.iris(heap_size=1 << 20)
    x = shmem.zeros((8, 16), dtype=torch.float32)
    x.fill_(float(shmem.get_rank() + 1))
    out = shmem.zeros((8, 16), dtype=torch.float32)
    shmem.barrier()
    shmem.ccl.all_reduce(out, x)
    torch.cuda.synchronize()
    world = shmem.get_num_ranks()
    assert torch.equal(out, torch.full((8, 16), world * (world + 1) / 2, device="cuda")), out
    print(f"all_reduce ok on rank {shmem.get_rank()}")
    shmem.barrier()
    dist.destroy_process_group()
"""


@pytest.mark.slow
@pytest.mark.skipif(not STAND_IN, reason="needs the CPU backend without a GPU")
def test_a_program_in_the_newest_style_runs_under_iris_run(tmp_path):
    script = tmp_path / "newest_style.py"
    script.write_text(textwrap.dedent(NEWEST_STYLE))
    environment = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "IRIS_CPU_CUDA")}
    out = subprocess.run([sys.executable, "-m", "iris", "run", "-n", "2", "--timeout", "200", str(script)],
                         env=dict(environment, IRIS_BACKEND="cpu"), capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("all_reduce ok") == 2, out.stdout + out.stderr
