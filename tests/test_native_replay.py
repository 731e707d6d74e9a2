"""iris.host.replay.native: the C host path of a repeated call makes call_key's key (the rest, then the config by
value), finds the plan and launches its graph only where the Python path would launch it as it is.

The C module is built here with the machine's C compiler, as on a GPU host. The CUDA driver's functions
(cuStreamIsCapturing, cuGraphLaunch, cuLaunchKernel) do not exist without a GPU: ctypes callbacks at their addresses
record what the C code hands them, so every decision of the module runs here; on a GPU the driver's own functions
take their place (tests/test_cuda_graphs.py runs the path there).
"""

import ctypes
import shutil
import tempfile
import types

import pytest
import torch
from triton import knobs

from iris.host.replay import native
from iris.host.replay import Plans, call_key

pytestmark = pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler here")

IS_CAPTURING = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int))
GRAPH_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
KERNEL_LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p)
EXECUTABLE, STREAM, DEVICE = 0x5EED, 0xAB0, 3


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    cache = tmp_path_factory.mktemp("native")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("IRIS_NATIVE_CACHE", str(cache))
        native.load.cache_clear()
        loaded, why = native.load()
        native.load.cache_clear()
    assert why is None and loaded is not None
    return loaded


class Driver:
    """Stand-ins for the driver's functions, at C addresses: what they were handed, and what they answer."""

    def __init__(self, capture_status=0, launch_result=0):
        self.capturing_asked, self.launched = [], []
        self.capture_status, self.launch_result = capture_status, launch_result

        def is_capturing(stream, status):
            self.capturing_asked.append(stream)
            status[0] = self.capture_status
            return 0

        def graph_launch(executable, stream):
            self.launched.append((executable, stream))
            return self.launch_result

        def kernel_launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            self.launched.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, params, extra))
            return self.launch_result

        self._callbacks = (IS_CAPTURING(is_capturing), GRAPH_LAUNCH(graph_launch),
                           KERNEL_LAUNCH(kernel_launch))  # kept alive with the driver
        self.addresses = tuple(ctypes.cast(c, ctypes.c_void_p).value for c in self._callbacks)


def _state(plans, driver, debug=False, runtime=None):
    team = types.SimpleNamespace(debug=debug)
    streams = []

    def current_stream(device):
        streams.append(device)
        return STREAM

    state = (plans, team, knobs.runtime if runtime is None else runtime, torch.Tensor, current_stream,
             *driver.addresses)
    return state, streams


def _planned(key, native=(EXECUTABLE, DEVICE), tensors=()):
    plan = Plans.Plan([lambda: None], "result")
    plan.native, plan.tensors = native, tensors
    return {key: plan}, plan


X = torch.arange(24, dtype=torch.bfloat16)
CONFIG = (object, 64, "x")  # a config by value (value_key)
CASES = {  # name, first, second, rest, the config by value
    "two contiguous": ("all_reduce", torch.zeros(24, dtype=torch.bfloat16), X, (None, None, False, None, True), None),
    "a config": ("all_reduce", torch.zeros(24, dtype=torch.bfloat16), X, (None, None, False, None, True), CONFIG),
    "one tensor": ("broadcast", X, None, (0, None, False, False), None),
    "a transposed view": ("all_gather", torch.zeros(4, 6).t(), torch.zeros(6, 4, dtype=torch.float16), (None,), None),
    "a strided view": ("all_to_all", torch.zeros(10)[::2], torch.zeros(3, 3)[:, :2], (), None),
    "nested operands": ("matmul_all_reduce", X, X, (call_key("", X, None), False, None, False), CONFIG),
    "a parameter": ("all_reduce", torch.nn.Parameter(torch.zeros(2)), X, (None,), None),
    "not a tensor": ("all_reduce", [1, 2], X, (None,), None),
    "second not a tensor": ("all_reduce", X, 3.0, (None,), None),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_key_is_call_keys_key(module, case):
    name, first, second, rest, last = CASES[case]
    driver = Driver()
    state, _ = _state({}, driver)
    key, plan = module.replay(state, name, first, second, rest, last)
    assert key == call_key(name, first, second, *rest, last)
    assert plan is None and driver.launched == []


def test_a_remembered_plan_launches_its_graph_on_its_devices_current_stream(module):
    name, first, second, rest, last = CASES["two contiguous"]
    plans, plan = _planned(call_key(name, first, second, *rest, last))
    driver = Driver()
    state, streams = _state(plans, driver)
    for _ in range(3):
        assert module.replay(state, name, first, second, rest, last)[1] is plan
    assert driver.launched == [(EXECUTABLE, STREAM)] * 3
    assert driver.capturing_asked == [STREAM] * 3 and streams == [DEVICE] * 3


REFUSALS = {
    "not captured yet": dict(native=None),
    "not a driver launch": dict(native=("executable",)),
    "tensors held weakly": dict(tensors=(lambda: X,)),
    "debug mode": dict(debug=True),
    "a launch hook": dict(runtime=types.SimpleNamespace(launch_enter_hook=lambda *a: None)),
    "a chain of hooks": dict(runtime=types.SimpleNamespace(launch_enter_hook=types.SimpleNamespace(calls=[print]))),
    "the stream is being captured": dict(capture_status=1),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_every_other_case_is_left_to_the_python_path(module, case):
    """Each condition under which Plans.replay would not launch the graph as it is: the C path hands the
    key back with no plan and launches nothing."""
    setting = REFUSALS[case]
    name, first, second, rest, last = CASES["two contiguous"]
    key = call_key(name, first, second, *rest, last)
    plans, _ = _planned(key, **{k: v for k, v in setting.items() if k in ("native", "tensors")})
    driver = Driver(capture_status=setting.get("capture_status", 0))
    state, _ = _state(plans, driver, debug=setting.get("debug", False), runtime=setting.get("runtime"))
    assert module.replay(state, name, first, second, rest, last) == (key, None)
    assert driver.launched == []


FUNCTION, PARAMS = 0xF00D, 0xBEEF0


def test_a_plan_of_one_packed_kernel_goes_out_by_cuLaunchKernel(module):
    """iris.host.replay.direct's plans: (function, grid x, y, z, threads, shared bytes, parameter array, device)
    is launched by cuLaunchKernel with those, on the device's current stream, no extra."""
    name, first, second, rest, last = CASES["two contiguous"]
    plans, plan = _planned(call_key(name, first, second, *rest, last),
                           native=(FUNCTION, 4, 2, 1, 128, 1024, PARAMS, DEVICE))
    driver = Driver()
    state, streams = _state(plans, driver)
    assert module.replay(state, name, first, second, rest, last)[1] is plan
    assert driver.launched == [(FUNCTION, (4, 2, 1), (128, 1, 1), 1024, STREAM, PARAMS, None)]
    assert streams == [DEVICE] and driver.capturing_asked == [STREAM]
    driver.launch_result = 1
    with pytest.raises(RuntimeError, match="cuLaunchKernel of a remembered call's kernel failed: CUresult 1"):
        module.replay(state, name, first, second, rest, last)


def test_an_empty_chain_of_hooks_is_no_hook(module):
    name, first, second, rest, last = CASES["one tensor"]
    plans, plan = _planned(call_key(name, first, second, *rest, last))
    driver = Driver()
    state, _ = _state(plans, driver, runtime=types.SimpleNamespace(launch_enter_hook=types.SimpleNamespace(calls=[])))
    assert module.replay(state, name, first, second, rest, last)[1] is plan and len(driver.launched) == 1


def test_a_failed_launch_raises_with_the_drivers_result(module):
    name, first, second, rest, last = CASES["two contiguous"]
    plans, _ = _planned(call_key(name, first, second, *rest, last))
    driver = Driver(launch_result=700)  # kept: its callbacks must outlive the call that reaches them
    state, _ = _state(plans, driver)
    with pytest.raises(RuntimeError, match="CUresult 700"):
        module.replay(state, name, first, second, rest, last)


def test_an_unhashable_argument_is_left_to_the_python_path(module):
    name, first, second, _, last = CASES["two contiguous"]
    rest = ([1, 2], None)
    state, _ = _state({}, Driver())
    key, plan = module.replay(state, name, first, second, rest, last)
    assert key == call_key(name, first, second, *rest, last) and plan is None


def test_a_malformed_state_is_refused(module):
    with pytest.raises(TypeError, match="state tuple"):
        module.replay((), "all_reduce", X, X, (), None)


def test_a_build_that_fails_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "false")  # a compiler that fails on everything
    with pytest.raises(RuntimeError, match="failed"):
        native.build(str(tmp_path))
    assert list(tmp_path.iterdir()) == []  # no half-written module left for another rank to load


def test_a_compiler_that_does_not_start_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with pytest.raises(OSError):
        native.build(str(tmp_path / "cache"))
    assert list((tmp_path / "cache").iterdir()) == []


def test_an_unwritable_cache_falls_back_to_a_temporary_directory(tmp_path, monkeypatch):
    """A read-only home (an apptainer image, a cluster's compute node) must not cost the C path: the module
    is built under the temporary directory instead."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("IRIS_NATIVE_CACHE", str(blocker / "native"))  # below a file: no directory can be made
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # what gettempdir() answers
    (tmp_path / "tmp").mkdir()
    native.load.cache_clear()
    try:
        module, why = native.load()
    finally:
        native.load.cache_clear()
    assert why is None and module is not None
    assert any((tmp_path / "tmp").rglob("iris_native_replay_*"))


def test_the_plans_hold_the_team_weakly():
    """Plans hold their context weakly (the heap dies with the context's last user): the C path's state
    must not keep the context's team, and with it the heap, alive either."""
    import gc
    import weakref

    class Team:
        debug = False

    class Context:
        def __init__(self):
            self.team = Team()

        def warning(self, message):
            raise AssertionError(message)

    ctx = Context()
    plans = Plans(weakref.proxy(ctx))
    plans._native, plans._state = plans._native_state(Driver().addresses, lambda device: STREAM)
    team = weakref.ref(ctx.team)
    del ctx
    gc.collect()
    assert team() is None


def test_plans_call_relaunches_a_captured_plan_from_c_and_keys_its_config_by_value():
    """Plans.call end to end over the C path: the first call runs and is remembered; once its plan has a graph the
    driver launches, a repeated call is found and launched in C without running again; a config changed in place
    is another call."""
    import dataclasses
    import weakref

    @dataclasses.dataclass
    class Knobs:
        block: int = 64

    class Team:
        debug = False

    class Heap:  # an open context's: nothing refused
        def refuse_if_closed(self, what):
            pass

    class Context:
        team = Team()
        heap = Heap()

        def warning(self, message):
            raise AssertionError(message)

    ctx, driver, runs = Context(), Driver(), []
    plans = Plans(weakref.proxy(ctx), config_type=Knobs)
    plans._native, plans._state = plans._native_state(driver.addresses, lambda device: STREAM)

    def first(ctx, tensor, count, config):
        runs.append((count, config.block))
        return [lambda: None], "result"

    x, knobs = torch.zeros(8), Knobs()
    assert plans.call("op", x, None, knobs, (3,), first, x, 3, knobs) == "result"
    (plan,) = plans.plans()
    plan.native = (EXECUTABLE, DEVICE)  # as a capture into a graph leaves it
    for _ in range(2):
        assert plans.call("op", x, None, knobs, (3,), first, x, 3, knobs) == "result"
    assert runs == [(3, 64)] and driver.launched == [(EXECUTABLE, STREAM)] * 2
    knobs.block = 128
    plans.call("op", x, None, knobs, (3,), first, x, 3, knobs)
    assert runs == [(3, 64), (3, 128)] and len(plans) == 2
