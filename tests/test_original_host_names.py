"""The original's host names: those of July 2025 that its examples call (``iris.do_bench``,
``iris.memset_tensor``, ``ctx.log`` / ``log_debug`` / ``log_stats``, ``ctx.parse_size``, ``ctx.deallocate``,
``ctx.wall_clock_rate``) and its newest (the module ``iris.iris``, ``iris.mem``, ``iris.Context``,
``iris.tensor_creation``, ``iris.Semantic`` / ``iris.Scope``, ``iris.get_num_xcc``, ``iris.get_device_id_for_rank``,
``iris.logger``, ``iris.tensor_from_ptr``, ``iris.CUDAArrayInterface``, ``iris.ops.FusedWorkspace`` /
``OpsNamespace`` and FusedConfig's newest fields)."""

import logging
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import iris
import triton
import triton.language as tl


@pytest.fixture(scope="module")
def ctx():
    context = iris.iris(1 << 20)
    yield context
    context.close()


def test_do_bench_runs_hooks_in_order_and_times_each_run():
    calls = []

    def fn():
        calls.append("fn")
        time.sleep(0.002)

    times = iris.do_bench(fn, barrier_fn=lambda: calls.append("b"), preamble_fn=lambda: calls.append("p"),
                          n_warmup=2, n_repeat=5, return_mode="all")
    assert len(times) == 5 and all(1.5 < t < 500 for t in times)  # milliseconds, each around fn's 2 ms sleep
    assert calls.count("fn") == 1 + 2 + 5
    assert calls[:4] == ["b", "p", "fn", "b"]  # the untimed first run
    assert calls[4:8] == ["b", "p", "b", "fn"] and calls[-1] == "b"  # each run: barrier, preamble, flush, barrier


def test_do_bench_statistics_and_quantiles():
    # Sleeps give each call a floor, never a ceiling (a loaded machine stretches them): the checks are the floors
    # each statistic must clear and the orders that hold for any sample.
    sleeps_ms = (1, 2, 3, 4, 50)
    stats = {}
    for mode in ("mean", "min", "max", "median"):
        delays = iter([0.0] * 2 + [ms / 1000 for ms in sleeps_ms])
        stats[mode] = iris.do_bench(lambda: time.sleep(next(delays)), n_warmup=1, n_repeat=5, return_mode=mode)
    assert stats["min"] <= stats["median"] <= stats["max"] and stats["min"] <= stats["mean"] <= stats["max"]
    assert stats["min"] >= 0.9 and stats["median"] >= 2.9 and stats["mean"] >= 11.9 and stats["max"] >= 49.9
    delays = iter([0.0] * 2 + [ms / 1000 for ms in sleeps_ms])
    low, mid, high = iris.do_bench(lambda: time.sleep(next(delays)), n_warmup=1, n_repeat=5,
                                   quantiles=[0.0, 0.5, 1.0])
    assert low <= mid <= high and low >= 0.9 and mid >= 2.9 and high >= 49.9
    delays = iter([0.0] * 2 + [0.001] * 3)
    single = iris.do_bench(lambda: time.sleep(next(delays)), n_warmup=1, n_repeat=3, quantiles=[0.5])
    assert isinstance(single, float)


@pytest.mark.parametrize("kwargs, match", [
    (dict(n_repeat=0), "n_repeat=0"),
    (dict(n_warmup=-1), "n_warmup=-1"),
    (dict(return_mode="average"), "return_mode='average'"),
    (dict(quantiles=[0.5, 1.5]), "1.5"),
    (dict(barrier_fn=3), "barrier_fn=3"),
])
def test_do_bench_refuses_bad_arguments_before_running(kwargs, match):
    ran = []
    with pytest.raises((ValueError, TypeError), match=match):
        iris.do_bench(lambda: ran.append(1), **kwargs)
    assert ran == []


def test_memset_tensor(ctx):
    flags = ctx.full((64,), 7, dtype=torch.int32)
    assert iris.memset_tensor(flags, 3) is flags and torch.equal(flags, torch.full_like(flags, 3))
    with pytest.raises(TypeError, match="value='x'"):
        iris.memset_tensor(flags, "x")


def test_parse_size_and_deallocate(ctx):
    assert ctx.parse_size((2, 3)) == ((2, 3), 6)
    assert ctx.parse_size((((4, 5),),)) == ((4, 5), 20)
    assert ctx.parse_size((torch.Size([3]),)) == ((3,), 3)
    assert ctx.parse_size(7) == ((7,), 7)
    with pytest.raises(ValueError, match="-1"):
        ctx.parse_size((2, -1))
    with pytest.raises(TypeError, match="2.5"):
        ctx.parse_size((2.5,))
    buf = ctx.zeros(16)
    assert ctx.deallocate(buf) is None and ctx.deallocate(buf.data_ptr()) is None


def test_log_methods_are_rank_prefixed_and_level_aware(ctx, capsys):
    try:
        iris.set_logger_level(iris.INFO)
        ctx.log("plain line")
        ctx.log_stats("stats line")
        ctx.log_debug("hidden debug line")
        iris.set_logger_level(iris.DEBUG)
        ctx.log_debug("shown debug line")
        iris.set_logger_level(iris.WARNING)
        ctx.log("hidden plain line")
    finally:
        iris.set_logger_level(iris.WARNING)
    err = capsys.readouterr().err
    assert "[Iris] [0/1] plain line" in err and "[Iris] [0/1] stats line" in err
    assert "[Iris] [0/1] shown debug line" in err
    assert "hidden" not in err


def test_wall_clock_rate(ctx):
    expected = {"hip": 100_000, "cuda": 1_000_000, "cpu": 1_000_000}[ctx.backend.name]
    assert ctx.wall_clock_rate(0) == expected == ctx.wall_clock_rate()
    with pytest.raises(ValueError, match="rank=1"):
        ctx.wall_clock_rate(1)


# -- the original's newest host names (issue 62) -----------------------------------------------------------


def test_iris_iris_is_the_factory_and_the_original_module_in_a_fresh_process():
    """``iris.iris(heap_size)`` stays the factory while ``from iris.iris import DeviceContext`` (the original's
    module path) and ``import iris.iris as m`` reach the module's names."""
    probe = textwrap.dedent("""
        import importlib, inspect
        import iris
        from iris.iris import DEBUG, DeviceContext, Iris, load, logger, set_logger_level
        from iris.iris import iris as factory
        import iris.iris as aliased
        module = importlib.import_module("iris.iris")
        assert inspect.isfunction(iris.iris) and iris.iris is factory is module.iris
        assert DeviceContext is iris.DeviceContext and Iris is iris.Iris and load is iris.load and DEBUG == iris.DEBUG
        assert logger is iris.logger and set_logger_level is iris.set_logger_level
        assert aliased.DeviceContext is iris.DeviceContext and aliased.Context is iris.DeviceContext
        assert iris.iris.DeviceContext is iris.DeviceContext
        print("ok", inspect.ismodule(module))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == ["ok", "True"], out.stderr


def test_the_newest_device_context_names():
    from iris.mem.triton import DeviceContext
    from iris.mem.triton.context import Context
    from iris.mem.triton.ops import atomic_add, get, load, put, store

    assert Context is DeviceContext is iris.DeviceContext is iris.Context is iris.mem.triton.Context
    assert (load, store, get, put, atomic_add) == (iris.load, iris.store, iris.get, iris.put, iris.atomic_add)
    from iris.context import TritonContext  # as the original's tests/unittests/*cache_modifiers* import it

    assert TritonContext is iris.TritonContext


def test_semantic_and_scope_are_the_strings_the_device_ops_take():
    assert [s.value for s in iris.Semantic] == ["relaxed", "acquire", "release", "acq_rel"]
    assert iris.Semantic.ACQ_REL == "acq_rel" and f"{iris.Semantic.RELEASE}" == "release"
    assert iris.Scope.SYS == "sys" and iris.Scope.SYSTEM is iris.Scope.SYS
    assert iris.Scope.GPU == "gpu" and iris.Scope.DEVICE is iris.Scope.GPU and iris.Scope.AGENT is iris.Scope.GPU
    assert iris.Scope.CTA == "cta" and iris.Scope.WORKGROUP is iris.Scope.CTA
    assert str(iris.Scope.SYS) == "sys" and iris.Semantic("acquire") is iris.Semantic.ACQUIRE


@triton.jit
def _ordered_adds(counter, out, heap_bases, SEM: tl.constexpr, SCOPE: tl.constexpr):
    rank = iris.current_rank(heap_bases)
    first = iris.atomic_add(counter, 5, rank, rank, heap_bases, sem=SEM, scope=SCOPE)
    second = iris.atomic_add(counter, 7, rank, rank, heap_bases, sem="acq_rel", scope="sys")
    tl.store(out, first)
    tl.store(out + 1, second)


def test_semantic_and_scope_run_in_kernels(ctx):
    """As constexpr arguments, beside the words they stand for (Triton 3.6 refuses a member read inside the kernel)."""
    start = int(torch.randint(1, 1000, ()).item())
    counter = ctx.full((1,), start, dtype=torch.int32)
    out = ctx.full((2,), -1, dtype=torch.int32)
    _ordered_adds[(1,)](counter, out, ctx.get_heap_bases(), iris.Semantic.RELEASE, iris.Scope.GPU)
    ctx.barrier()
    assert out.tolist() == [start, start + 5] and counter.item() == start + 12


def test_get_num_xcc_is_one_off_amd(ctx):
    assert iris.get_num_xcc() == 1 and iris.get_num_xcc(0) == 1
    assert ctx.get_num_xcc() == 1 and iris.Iris.get_num_xcc(ctx) == 1


def test_xcc_count_on_amd_asks_the_device_then_the_architecture():
    from iris.runtime.hip import hip_xcc_count

    class Lib:
        def __init__(self, status, value):
            self.status, self.value, self.calls = status, value, []

        def hipDeviceGetAttribute(self, out, attribute, index):
            self.calls.append((attribute.value, index.value))
            out._obj.value = self.value
            return self.status

    asked = Lib(0, 4)
    assert hip_xcc_count(asked, 3, "7.0.1", "gfx942:sramecc+:xnack-") == 4 and asked.calls == [(10018, 3)]
    assert hip_xcc_count(Lib(1, 0), 0, "7.1", "gfx950") == 8       # the attribute refused: MI350 has 8
    assert hip_xcc_count(Lib(0, 2), 0, "6.4.2", "gfx942") == 8     # ROCm 6 lacks the attribute: not asked
    assert hip_xcc_count(Lib(1, 0), 0, "7.0", "gfx90a") == 1       # MI250X: one XCC per device
    assert hip_xcc_count(None, 0, None, "gfx942") == 8


def test_get_device_id_for_rank():
    device = iris.runtime.get_backend().device_for(5)
    assert iris.get_device_id_for_rank(5) == (device.index or 0)
    assert iris.get_device_id_for_rank(0) == 0
    for bad in (-1, 1.5, "0", True):
        with pytest.raises((TypeError, ValueError), match=repr(bad)):
            iris.get_device_id_for_rank(bad)


def test_logger_is_the_iris_logger():
    assert iris.logger is logging.getLogger("iris") and isinstance(iris.logger, logging.Logger)


def test_tensor_creation_helpers():
    tc = iris.tensor_creation
    assert tc.parse_size((2, 3)) == ((2, 3), 6) and tc.parse_size(((2, 3),)) == ((2, 3), 6)
    assert tc.parse_size(([4, 5],)) == ([4, 5], 20) and tc.parse_size(((),)) == ((), 1)
    assert tc.parse_size((7,)) == ((7,), 7)
    with pytest.raises(ValueError, match="-2"):
        tc.parse_size((3, -2))
    gpu = torch.device("cuda:0")
    assert tc.is_valid_device(None, gpu) and tc.is_valid_device("cuda", gpu) and tc.is_valid_device(gpu, gpu)
    assert not tc.is_valid_device("cpu", gpu) and not tc.is_valid_device("cuda:1", gpu)
    assert tc.is_valid_device("cuda", torch.device("cpu")) and tc.is_valid_device("cpu", torch.device("cpu"))
    with pytest.raises(RuntimeError, match="cpu"):
        tc.throw_if_invalid_device("cpu", gpu)
    tc.throw_if_invalid_device(None, gpu)
    t = torch.zeros(2, 3)
    assert tc.apply_layout(t, torch.strided) is t
    with pytest.raises(ValueError, match="sparse_coo"):
        tc.apply_layout(t, torch.sparse_coo)


def test_tensor_creation_output_checks(ctx):
    tc = iris.tensor_creation
    with pytest.raises(RuntimeError, match="4 elements, but 9 are required"):
        tc.throw_if_invalid_output_tensor(ctx.heap, ctx._Iris__allocate(4, torch.float32), 9, torch.float32)
    with pytest.raises(RuntimeError, match="dtype torch.int32, but torch.float32 is required"):
        tc.throw_if_invalid_output_tensor(ctx.heap, ctx._Iris__allocate(9, torch.int32), 9, torch.float32)
    with pytest.raises(RuntimeError, match="not on the symmetric heap"):
        tc.throw_if_invalid_output_tensor(ctx.heap, torch.zeros(9), 9, torch.float32)
    tc.throw_if_invalid_output_tensor(ctx.heap, ctx._Iris__allocate(9, torch.float32), 9, torch.float32)


def test_tensor_creation_factories_allocate_on_the_heap(ctx):
    tc, heap, device = iris.tensor_creation, ctx.heap, ctx.get_device()
    made = {
        "zeros": (tc.zeros(heap, device, (2, 3), dtype=torch.float32), torch.zeros(2, 3)),
        "ones": (tc.ones(heap, device, (4,), dtype=torch.int32), torch.ones(4, dtype=torch.int32)),
        "full": (tc.full(heap, device, (5,), 3.5, dtype=torch.float32), torch.full((5,), 3.5)),
        "full_int": (tc.full(heap, device, (2,), 7), torch.full((2,), 7)),
        "arange": (tc.arange(heap, device, 2, 11, 3), torch.arange(2, 11, 3)),
        "linspace": (tc.linspace(heap, device, 0.0, 1.0, 5), torch.linspace(0.0, 1.0, 5)),
    }
    source = ctx.full((3, 3), 9.0, dtype=torch.float64)
    made["zeros_like"] = (tc.zeros_like(heap, device, source), torch.zeros(3, 3, dtype=torch.float64))
    for name, (got, want) in made.items():
        assert ctx.is_symmetric(got), name
        assert got.dtype == want.dtype and torch.equal(got.cpu(), want), name
    out = ctx.full((6,), -1.0)
    assert tc.zeros(heap, device, (2, 3), out=out).data_ptr() == out.data_ptr() and out.eq(0).all()
    g = torch.Generator(device=device).manual_seed(3)
    drawn = [tc.rand(heap, device, (64,), generator=g), tc.randn(heap, device, (64,)),
             tc.randint(heap, device, 5, 9, (64,)), tc.uniform(heap, device, (64,), -2.0, -1.0),
             tc.empty(heap, device, (4, 4))]
    assert all(ctx.is_symmetric(t) for t in drawn)
    assert 0 <= drawn[0].min() and drawn[0].max() < 1 and drawn[1].std() > 0.5
    assert drawn[2].dtype == torch.int64 and 5 <= drawn[2].min() and drawn[2].max() < 9
    assert -2 <= drawn[3].min() and drawn[3].max() < -1 and drawn[4].shape == (4, 4)
    with pytest.raises(RuntimeError, match="Device|device"):
        tc.zeros(heap, torch.device("cuda:0"), (2,), device="cpu")


def test_tensor_from_ptr_aliases_memory(ctx):
    source = ctx.randn(8, 4, dtype=torch.float32)
    view = iris.tensor_from_ptr(source.data_ptr(), source.numel() * 4, dtype=torch.float32, device="cuda")
    assert view.shape == (32,) and view.data_ptr() == source.data_ptr() and torch.equal(view, source.flatten())
    view[5] = 123.0
    assert source.flatten()[5].item() == 123.0
    shaped = iris.tensor_from_ptr(source.data_ptr(), 64, dtype=torch.bfloat16, device="cuda", shape=(4, 8))
    assert shaped.dtype == torch.bfloat16 and shaped.shape == (4, 8) and shaped.data_ptr() == source.data_ptr()
    interface = iris.CUDAArrayInterface(source.data_ptr(), 128, dtype=torch.float16)
    assert interface.shape == (64,) and interface.typestr == "<f2" and interface.size_bytes == 128
    assert interface.__cuda_array_interface__ == {"shape": (64,), "typestr": "<f2",
                                                  "data": (source.data_ptr(), False), "version": 3}
    assert iris.CUDAArrayInterface(1 << 20, 8).dtype == torch.uint8
    with pytest.raises(ValueError, match="complex64"):
        iris.CUDAArrayInterface(1 << 20, 8, dtype=torch.complex64)


def test_the_newest_ops_names_and_fused_config_fields():
    from iris.ops import FusedConfig, FusedWorkspace, Ops, OpsNamespace, Workspace

    assert FusedWorkspace is Workspace and OpsNamespace is Ops
    config = FusedConfig()
    assert (config.num_sms, config.num_xcds, config.chunk_size) == (None, 1, 1)
    assert (config.cache_modifier_a, config.cache_modifier_b, config.allow_tf32) == (".ca", ".ca", True)
    assert (config.all_reduce_num_rings, config.ksplit) == (1, False)
    tuned = FusedConfig(num_sms=104, num_xcds=8, chunk_size=4, cache_modifier_a=".cg", cache_modifier_b=None,
                        allow_tf32=False, all_reduce_variant="ring", all_reduce_num_rings=2, ksplit=True)
    assert tuned.validate(world_size=2) is None and tuned.num_sms == 104
    for field, bad in (("num_sms", 0), ("num_xcds", 0), ("chunk_size", -1), ("all_reduce_num_rings", 0),
                       ("cache_modifier_a", ".zz"), ("cache_modifier_b", 3), ("allow_tf32", "yes"), ("ksplit", 1),
                       ("num_sms", 2.5)):
        with pytest.raises(ValueError, match=f"FusedConfig.{field}={bad!r}"):
            FusedConfig(**{field: bad})
    with pytest.raises(ValueError, match="block_size_n"):
        FusedConfig(all_reduce_variant="ring", block_size_n=64).validate(world_size=3)
