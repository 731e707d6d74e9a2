"""Names and behaviours of the original Iris's API that code written for it relies on (issue 19).

Each check runs where that code runs: in every rank of a job, through ``import iris`` alone.
The device-side argument orders of load and get are in tests/test_device_api.py; debug mode's
cross-rank check of collectives in tests/test_debug.py.
"""

import pytest
import torch

import iris


def _host_names_on_rank():
    ctx = iris.iris(1 << 20)
    flat = ctx.allocate(10, torch.int32)
    nested = ctx.zeros(((2, 3, 4),))  # the original unwraps a size nested at any depth
    empties = [ctx.zeros(0), ctx.empty((2, 0)), ctx.zeros(4)[:0]]
    found = dict(
        allocate=(tuple(flat.shape), flat.dtype, ctx.is_symmetric(flat)),
        nested=tuple(nested.shape),
        empty_on_heap=[ctx.is_symmetric(t) for t in empties],
        empty_elsewhere=ctx.is_symmetric(torch.zeros(0, device=ctx.get_device())),
        device=(ctx.device, str(ctx.get_device()), type(ctx.get_device()).__name__),
    )
    ctx.close()
    return found


def test_host_names_of_the_original(ranks):
    for found in ranks.run(_host_names_on_rank):
        assert found["allocate"] == ((10,), torch.int32, True)
        assert found["nested"] == (2, 3, 4)
        assert found["empty_on_heap"] == [True, True, True]  # an empty tensor made by the heap is on it
        assert found["empty_elsewhere"] is False
        assert found["device"][0] == found["device"][1] and found["device"][2] == "device"  # str, as the original's


def test_triton_context_is_the_device_context():
    assert iris.TritonContext is iris.DeviceContext


def test_the_originals_config_fields_are_accepted():
    from iris.ccl import AUTOTUNE, Config
    from iris.ops import FusedConfig

    config = Config(comm_sms=48, swizzle_size=3, use_gluon=True, all_gather_variant="partitioned",
                    reduce_scatter_variant="ring_chunked", all_reduce_num_rings=2, num_warps=8, threads_per_warp=32)
    assert (config.num_xcds, config.chunk_size, config.all_reduce_ring_slice_n) == (1, 9, config.block_size_n)
    tuned = Config.autotune(comm_sms=64)
    assert tuned.comm_sms == 64 and tuned.block_size == Config().block_size and tuned.all_reduce_variant is None
    assert Config(block_size_m=AUTOTUNE).block_size_m == Config().block_size_m
    assert FusedConfig(all_reduce_variant="two_shot").all_reduce_variant == "two_shot"
    for bad in (dict(all_gather_variant="tree"), dict(threads_per_warp=48), dict(all_reduce_ring_slice_n=48),
                dict(comm_sms=0)):
        with pytest.raises(ValueError):
            Config(**bad)
    with pytest.raises(ValueError):
        FusedConfig(all_reduce_variant="tree")


def _original_variants_on_rank():
    from iris.ccl import Config

    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    x = ctx.full((64, 32), float(rank + 1))
    gathered = ctx.zeros(64 * world, 32)
    ctx.ccl.all_gather(gathered, x, config=Config(all_gather_variant="partitioned"))
    scattered = ctx.zeros(64 // world, 32)
    ctx.ccl.reduce_scatter(scattered, x, config=Config(reduce_scatter_variant="ring_chunked"))
    a, b = ctx.ones(32, 16, dtype=torch.bfloat16), ctx.ones(16, 32, dtype=torch.bfloat16)
    out = ctx.zeros(32, 32)
    prepared = iris.ops.matmul_all_reduce_preamble(ctx, out, a, b)
    used = iris.ops.matmul_all_reduce(ctx, out, a, b)  # the original's standalone form returns its workspace
    full = ctx.full((32, 32), float("nan"))  # the original's matmul_reduce_scatter layout, into (M, N)
    from iris.ops.matmul_reduce_scatter import matmul_reduce_scatter  # the original's module path

    matmul_reduce_scatter(ctx, full, a, b)  # FusedConfig's 128 x 256 blocks: one, so the last rank's run
    ctx.barrier()
    found = dict(gathered=gathered[::64, 0].tolist(), scattered=scattered.unique().tolist(),
                 workspace=type(used).__name__, same_key=used.key == prepared.key, out=out.unique().tolist(),
                 full=full.unique().tolist())
    ctx.close()
    return found


def test_the_originals_variants_and_standalone_forms_run(ranks):
    world = ranks.world_size
    total = world * (world + 1) / 2
    for rank, found in enumerate(ranks.run(_original_variants_on_rank)):
        assert found["gathered"] == [float(r + 1) for r in range(world)]
        assert found["scattered"] == [total]
        assert found["workspace"] == "Workspace" and found["same_key"]
        assert found["out"] == [16.0 * world]
        assert found["full"] == ([16.0 * world] if rank == world - 1 else [0.0]), (rank, found["full"])


KERNELS_FIRST = """
import torch
import triton
import triton.language as tl


@triton.jit
def plus_one(x):
    return x + 1


@triton.jit
def kernel(x, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x + offs, plus_one(tl.load(x + offs, mask=offs < n)), mask=offs < n)


import iris  # noqa: E402  (after the kernels: a module that imports triton first, then iris)

ctx = iris.iris(1 << 20)
x = ctx.zeros(5, dtype=torch.int32)
kernel[(1,)](x, 5, BLOCK=8)
print("RESULT", x.tolist())
"""


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul",
                                "matmul_all_gather", "gemm_all_scatter"])
def test_each_fused_op_has_the_originals_module(op):
    import importlib

    module = importlib.import_module(f"iris.ops.{op}")
    assert module.__name__ == f"iris.ops.{op}"
    assert getattr(module, op) is getattr(iris.ops, op) and callable(getattr(iris.ops, op))  # not shadowed
    assert getattr(module, f"{op}_preamble") is getattr(iris.ops, f"{op}_preamble")


def test_kernels_defined_before_import_iris_run(tmp_path):
    """The original's tests import triton (and define kernels) before iris: on the CPU backend those
    kernels still run (under the interpreter), whatever the import order."""
    import subprocess

    from iris.testing.cross_compile import python_command  # the gate where IRIS_CROSS_COMPILE asks for it

    script = tmp_path / "kernels_first.py"
    script.write_text(KERNELS_FIRST)
    os = __import__("os")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # this checkout's iris, installed or not (a GPU machine's tree may be on the path only through PYTHONPATH)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(python_command([str(script)]), capture_output=True, text=True, env=env, timeout=300)
    assert "RESULT [1, 1, 1, 1, 1]" in out.stdout, out.stdout + out.stderr[-3000:]


def test_heap_allocate_takes_an_element_count_and_arange_raises_value_errors():
    """The original's tests allocate with ``ctx.heap.allocate(num_elements, dtype)`` and expect ``arange``'s
    bad steps and ranges to raise ValueError ("step must be non-zero"), not torch's RuntimeError."""
    ctx = iris.iris(1 << 20)
    try:
        flat = ctx.heap.allocate(6, torch.float32)
        assert tuple(flat.shape) == (6,) and flat.dtype == torch.float32 and ctx.is_symmetric(flat)
        assert ctx.ones(2, 3, out=flat).data_ptr() == flat.data_ptr()
        assert tuple(ctx.heap.allocate((2, 3), torch.int32).shape) == (2, 3)
        with pytest.raises(ValueError, match="step must be non-zero"):
            ctx.arange(1, 5, 0)
        with pytest.raises(ValueError):
            ctx.arange(5, 1)
        with pytest.raises(ValueError):
            ctx.arange(1, 5, -1)
        assert ctx.arange(3, 3).numel() == 0 and ctx.arange(5, 0, -1).tolist() == [5, 4, 3, 2, 1]
    finally:
        ctx.close()


def test_out_is_returned_itself_and_a_bad_out_raises_runtime_error():
    """The original returns ``out`` itself and raises RuntimeError for a wrong ``out=`` (its test_ones,
    test_arange and test_is_symmetric); ValueError still catches it, as Iris raised before."""
    ctx = iris.iris(1 << 20)
    try:
        out = ctx.heap.allocate(3, torch.int64)
        assert ctx.arange(3, out=out) is out
        flat = ctx.zeros(100)
        assert ctx.zeros(100, out=flat) is flat
        for bad in (ctx.heap.allocate(4, torch.float32), ctx.heap.allocate(9, torch.int32), torch.ones(3, 3)):
            with pytest.raises(RuntimeError):
                ctx.ones(3, 3, dtype=torch.float32, out=bad)
            with pytest.raises(ValueError):
                ctx.ones(3, 3, dtype=torch.float32, out=bad)
    finally:
        ctx.close()


def test_iris_formatter_of_the_original():
    import logging

    from iris.runtime.logging import IrisFormatter

    record = logging.LogRecord("iris", logging.INFO, "", 0, "no rank", (), None)
    assert IrisFormatter().format(record) == "[Iris] no rank"
    record = logging.LogRecord("iris", logging.INFO, "", 0, "with rank", (), None)
    record.iris_rank, record.iris_num_ranks = 2, 4
    assert IrisFormatter().format(record) == "[Iris] [2/4] with rank"


def test_the_host_adapters_are_bound_from_compat():
    """The original's host names are iris.compat.context's functions bound onto the native class, and each
    adapts onto the native API: log and log_stats log at info level, log_debug at debug level."""
    import logging
    import types

    from iris import context

    for name in ("log", "log_debug", "log_stats", "allocate", "_Iris__allocate", "parse_size", "deallocate"):
        assert getattr(iris.Iris, name).__module__ == "iris.compat.context", name
    assert isinstance(vars(iris.Iris)["device"], property) and "vmem" in context.ALLOCATORS
    assert context.TritonContext is iris.DeviceContext

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    level = iris.logger.level
    iris.logger.addHandler(handler)
    try:
        iris.set_logger_level(iris.DEBUG)
        fake = types.SimpleNamespace(cur_rank=1, num_ranks=2)
        fake.info = types.MethodType(iris.Iris.info, fake)
        fake.debug = types.MethodType(iris.Iris.debug, fake)
        for name in ("log", "log_stats", "log_debug"):
            getattr(iris.Iris, name)(fake, name)
    finally:
        iris.logger.removeHandler(handler)
        iris.logger.setLevel(level)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "log"), (logging.INFO, "log_stats"), (logging.DEBUG, "log_debug")]


def test_the_fused_config_of_the_original_is_a_native_subclass():
    """``iris.ops.FusedConfig`` carries the original's fields; the native class does not, and a config of the
    public class is a native config that replaces, compares and keys its replay like one."""
    import dataclasses

    from iris.host.replay.plans import value_key
    from iris.ops.config import FusedConfig as Native

    public = iris.ops.FusedConfig
    assert public is not Native and issubclass(public, Native) and public.__name__ == "FusedConfig"
    hints = ["num_sms", "num_xcds", "chunk_size", "cache_modifier_a", "cache_modifier_b", "allow_tf32",
             "all_reduce_num_rings", "reduce_num_sms", "ksplit"]
    native_fields = [f.name for f in dataclasses.fields(Native)]
    assert not set(hints) & set(native_fields)
    assert [f.name for f in dataclasses.fields(public)] == native_fields + hints
    config = public(64, 128, num_sms=104)  # positional: the native fields' order
    assert (config.block_size_m, config.block_size_n, config.num_sms) == (64, 128, 104)
    assert repr(config).startswith("FusedConfig(block_size_m=64, block_size_n=128,")
    changed = dataclasses.replace(config, block_size_n=256)
    assert type(changed) is public and changed.num_sms == 104 and changed == public(64, num_sms=104)
    assert value_key(config, Native) == value_key(public(64, 128, num_sms=104), Native)
    assert value_key(config, Native) != value_key(changed, Native)
    with pytest.raises(ValueError, match="FusedConfig.num_sms=0"):
        dataclasses.replace(config, num_sms=0)
    with pytest.raises(ValueError, match="FusedConfig.block_size_n=100"):
        public(block_size_n=100, num_sms=3)


def test_native_modules_leave_the_original_to_compat():
    """Outside iris/compat, no file of iris/ names the original Iris."""
    from pathlib import Path

    root = Path(iris.__file__).parent
    naming = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                    if "compat" not in p.relative_to(root).parts and "original" in p.read_text().lower())
    assert naming == [], naming


def test_the_ccl_config_of_the_original_is_a_native_subclass():
    """``iris.ccl.Config`` (and the original's module path ``iris.ccl.config``) carries the original's fields and
    AUTOTUNE; the native class (``CollectiveConfig``, which native code names) does not. A public config is a native
    one (every collective takes it, replays key it by value); the defaults native code makes stay native."""
    import dataclasses

    import iris.ccl.config
    from iris.ccl import _common, reduce_scatter
    from iris.ccl.config import AUTOTUNE, Config
    from iris.host.replay.plans import value_key

    public = iris.ccl.Config
    native = public.__mro__[1]
    assert Config is public and AUTOTUNE is iris.ccl.AUTOTUNE and repr(AUTOTUNE) == "AUTOTUNE"
    assert public is not native and issubclass(public, native) and public.__name__ == "Config"
    hints = ["comm_sms", "num_xcds", "chunk_size", "use_gluon", "all_reduce_num_rings", "all_reduce_ring_slice_n",
             "num_stages", "num_warps", "threads_per_warp", "waves_per_eu"]
    native_fields = [f.name for f in dataclasses.fields(native)]
    assert not set(hints) & set(native_fields) and not hasattr(native, "autotune")
    assert [f.name for f in dataclasses.fields(public)] == native_fields + hints
    assert type(_common.config_or_default(None)) is native and type(reduce_scatter._default_tiles(64)) is native
    assert native is iris.ccl.config.CollectiveConfig and native.__name__ == "CollectiveConfig"

    config = public(block_size=512, comm_sms=48, swizzle_size=3, use_gluon=True)
    assert (config.num_xcds, config.chunk_size, config.all_reduce_ring_slice_n) == (1, 9, 64)
    assert repr(config).startswith("Config(block_size=512, block_size_m=32,")
    changed = dataclasses.replace(config, block_size_n=128)
    assert type(changed) is public and changed.comm_sms == 48 and changed == public(
        block_size=512, block_size_n=128, comm_sms=48, swizzle_size=3, use_gluon=True, all_reduce_ring_slice_n=64)
    assert changed != config and public() != native()  # a native config equals only a native one
    assert value_key(config, native) == value_key(dataclasses.replace(config), native) != value_key(changed, native)
    assert value_key(native(), native) == value_key(native(), native) != value_key(public(), native)
    import pickle

    assert pickle.loads(pickle.dumps(native())) == native() and pickle.loads(pickle.dumps(config)) == config

    resolved = public(block_size_n=AUTOTUNE, swizzle_size=AUTOTUNE, all_reduce_ring_slice_n=AUTOTUNE,
                      chunk_size=AUTOTUNE)  # the native fields first: the original's checks see their defaults
    assert (resolved.block_size_n, resolved.all_reduce_ring_slice_n, resolved.chunk_size) == (64, 64, 16)
    assert public(block_size_n=32, all_reduce_ring_slice_n=AUTOTUNE).all_reduce_ring_slice_n == 32
    assert public.autotune(block_size_n=128) == public(block_size_n=128)
    with pytest.raises(TypeError, match="no such field"):
        public.autotune(comm_sm=64)
    for bad, message in [(dict(comm_sms=0), "Config.comm_sms=0: must be a positive int"),
                         (dict(num_warps=True), "Config.num_warps=True"),
                         (dict(threads_per_warp=48), "Config.threads_per_warp=48: must be 32 or 64"),
                         (dict(all_reduce_ring_slice_n=48), "Config.all_reduce_ring_slice_n=48: must be a power"),
                         (dict(all_reduce_ring_slice_n=128), "all_reduce_ring_slice_n=128: must divide block_size_n"),
                         (dict(swizzle_size=0), "Config.swizzle_size=0"),
                         (dict(block_size_n=100, comm_sms=3), "Config.block_size_n=100")]:
        with pytest.raises(ValueError, match=message):
            public(**bad)
    for bad in (dict(swizzle_size=0), dict(all_gather_variant="tree"), dict(cache_modifier=".xx")):
        with pytest.raises(ValueError):  # the native checks of the fields native code reads
            native(**bad)
