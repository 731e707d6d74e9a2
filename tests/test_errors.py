"""Bad input gets a clear exception before any kernel launch (world of one, in this process)."""

import os
import subprocess
import sys

import pytest
import torch

import iris


@pytest.fixture
def ctx():
    c = iris.iris(1 << 16)
    yield c
    c.close()


@pytest.mark.parametrize("size", [0, -1, -(1 << 30)])
def test_heap_size_must_be_positive(size):
    with pytest.raises(ValueError, match="heap_size"):
        iris.iris(size)


@pytest.mark.parametrize("size", [1.5, "1GB", None, True])
def test_heap_size_must_be_an_integer(size):
    with pytest.raises(TypeError, match="heap_size"):
        iris.iris(size)


def test_unknown_allocator():
    with pytest.raises(ValueError, match="allocator_type='cuda_malloc'.*torch, vmem"):
        iris.iris(1 << 16, allocator_type="cuda_malloc")


def test_heap_overflow_names_requested_and_free_bytes(ctx):
    ctx.zeros(1000, dtype=torch.uint8)
    with pytest.raises(MemoryError, match=r"requested 65536 bytes.*64512 bytes free of 65536"):
        ctx.empty(65536, dtype=torch.uint8)


@pytest.mark.parametrize("bad", [(-1,), (2, -3), (2.5,), ("3",), ((2, 1.0),)])
def test_bad_sizes(ctx, bad):
    with pytest.raises((TypeError, ValueError), match="size"):
        ctx.zeros(*bad)


def test_out_must_be_on_the_heap(ctx):
    with pytest.raises(ValueError, match="symmetric heap"):
        ctx.zeros(4, out=torch.empty(4))


def test_out_must_match(ctx):
    with pytest.raises(ValueError, match="dtype"):
        ctx.zeros(4, out=ctx.empty(4, dtype=torch.int32))
    with pytest.raises(ValueError, match="elements"):
        ctx.zeros(4, out=ctx.empty(5))


def test_foreign_device_is_refused(ctx):
    with pytest.raises(ValueError, match="device="):
        ctx.zeros(4, device="meta")


def test_closed_context_refuses_allocation():
    c = iris.iris(1 << 16)
    c.close()
    with pytest.raises(RuntimeError, match="closed"):
        c.zeros(4)


def _iris_in_subprocess(env_overrides):
    env = dict(os.environ, **env_overrides)
    code = "import iris\ntry:\n    iris.iris(1 << 16)\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout


def test_unknown_backend_is_reported_at_context_creation():
    out = _iris_in_subprocess({"IRIS_BACKEND": "tpu"})
    assert out.startswith("ValueError") and "IRIS_BACKEND='tpu'" in out and "cuda, hip, cpu" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message given where there is no GPU")
def test_cuda_backend_without_gpu():
    out = _iris_in_subprocess({"IRIS_BACKEND": "cuda"})
    assert out.startswith("BackendError") and "torch sees no GPU" in out and "IRIS_BACKEND=cpu" in out


def test_device_barrier_group_needs_torch_distributed(ctx):
    ctx.device_barrier()  # a world of one: returns at once
    with pytest.raises(ValueError, match="needs torch.distributed"):
        ctx.device_barrier(group=object())


def _non_member_device_barrier():
    import torch.distributed as dist

    ctx = iris.iris(1 << 16)
    only_zero = dist.new_group([0])  # default backends: see Iris.device_barrier
    outcome = "ok"
    if ctx.get_rank() == 0:
        ctx.device_barrier(only_zero)
    else:
        try:
            ctx.device_barrier(only_zero)
        except ValueError as exc:
            outcome = str(exc)
    ctx.close()
    return outcome


def test_device_barrier_refuses_a_rank_outside_the_group(ranks):
    outcomes = ranks.run(_non_member_device_barrier)
    assert outcomes[0] == "ok"
    assert all("is not in the group [0]" in text for text in outcomes[1:]), outcomes
