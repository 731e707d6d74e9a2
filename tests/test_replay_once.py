"""One replay mechanism: every remembered ``ctx.ccl``/``ctx.ops`` call goes through :meth:`Plans.call`, entered once
per call, first call or repeated; its parts (key, lookup, relaunch, remembering, the debug-mode check) are put
together there only."""

import ast
import sys
from pathlib import Path

import pytest
import torch

import iris
from iris.host.replay import Plans
from iris.testing.ranks import RankPool

PACKAGE = Path(__file__).resolve().parent.parent / "iris"
REMEMBERED = {
    ("ccl/__init__.py", "CCL"): ("all_gather", "all_to_all", "all_to_all_v", "broadcast", "reduce_scatter", "reduce",
                                 "gather", "scatter", "send", "recv", "sendrecv", "all_reduce_rmsnorm", "all_reduce"),
    ("ops/__init__.py", "Ops"): ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul",
                                 "matmul_all_gather", "gemm_all_scatter"),
}
#: Plans' own steps, which only Plans.call puts together
STEPS = ("replay_call", "replay", "remember")


def _calls(function: ast.FunctionDef, of: str) -> list[str]:
    """The methods of ``self.<of>`` (``of`` empty: of ``self``) that ``function`` calls."""
    def owner(node):
        return node.attr if isinstance(node, ast.Attribute) else ""

    return [node.func.attr for node in ast.walk(function)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and (owner(node.func.value) == of if of else getattr(node.func.value, "id", None) == "self")]


@pytest.mark.parametrize("path, cls", list(REMEMBERED), ids=[cls for _, cls in REMEMBERED])
def test_every_remembered_method_enters_plans_call_once_and_no_step_of_it(path, cls):
    """Each remembered method calls Plans.call once, itself or through one helper method of its class (Ops._call,
    which makes a fused op's key); no method calls a step of Plans.call itself."""
    tree = ast.parse((PACKAGE / path).read_text())
    (body,) = [node.body for node in tree.body if isinstance(node, ast.ClassDef) and node.name == cls]
    methods = {node.name: node for node in body if isinstance(node, ast.FunctionDef)}

    def entries(method):
        own = _calls(method, "_plans").count("call")
        return own + sum(entries(methods[name]) for name in _calls(method, "") if name in methods)

    for name in REMEMBERED[(path, cls)]:
        assert entries(methods[name]) == 1, f"{cls}.{name} does not go through Plans.call once"
    for name, method in methods.items():
        steps = [step for step in _calls(method, "_plans") if step in STEPS]
        assert not steps, f"{cls}.{name} calls Plans.{steps[0]} itself: its call should go through Plans.call"


def test_x_inference_and_compile_remember_nothing_themselves():
    """They reach the replay only through ctx.ccl and ctx.ops."""
    for path in [*(PACKAGE / "x").glob("*.py"), PACKAGE / "inference.py", *(PACKAGE / "compile").glob("*.py")]:
        source = path.read_text()
        assert "iris.host.replay" not in source and "Plans" not in source, path


def _entries(call) -> tuple[list[str], list[str]]:
    """``call()`` under a profiler: the Plans methods entered from outside plans.py, and which of a call's first run
    (``_first_all_reduce``) and the bound launches ran."""
    steps = {getattr(Plans, name).__code__: name for name in ("call", *STEPS) if hasattr(Plans, name)}
    plans_file = sys.modules[Plans.__module__].__file__
    entered, ran = [], []

    def profile(frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        if code in steps and frame.f_back.f_code.co_filename != plans_file:
            entered.append(steps[code])
        elif code.co_name == "__call__" and code.co_filename == plans_file:  # a bound launch, (re)launched
            ran.append("launch")
        elif code.co_name == "_first_all_reduce":
            ran.append("first run")

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return entered, ran


def _one_all_reduce_twice():
    with pytest.MonkeyPatch.context() as env:
        env.setenv("IRIS_GRAPH_REPLAY", "0")  # on a GPU too, a replay relaunches each bound launch from Python
        ctx = iris.iris(1 << 20)
        ctx.ccl  # noqa: B018  (its remembered calls read the switch now)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    x, out = ctx.empty(256, dtype=torch.float32), ctx.empty(256, dtype=torch.float32)
    seen = []
    for round in (1, 2, 3):
        x.copy_(torch.arange(256, dtype=torch.float32) + 1000 * round * (rank + 1))
        out.fill_(float("nan"))
        ctx.barrier()
        entered, ran = _entries(lambda: ctx.ccl.all_reduce(out, x))
        ctx.barrier()
        expected = torch.arange(256, dtype=torch.float32) * world + 1000 * round * world * (world + 1) / 2
        seen.append((entered, ran, torch.equal(out.cpu(), expected), len(ctx.ccl._plans)))
    launches = len(ctx.ccl._plans.plans()[0].launches)
    ctx.close()
    return seen, launches


def test_a_call_enters_the_replay_once_and_a_repeated_call_is_replayed_once(ranks):
    """The first call: Plans.call only (not a lookup, then a remembering); the repeated calls: Plans.call
    relaunches the remembered launches, each once, without the collective's host path, and the result is right."""
    for seen, launches in ranks.run(_one_all_reduce_twice):
        first, *repeated = seen
        assert first[0] == ["call"] and "first run" in first[1] and first[2:] == (True, 1), first
        for entered, ran, right, plans in repeated:
            assert (entered, ran, right, plans) == (["call"], ["launch"] * launches, True, 1)


def _debug_calls():
    ctx = iris.iris(1 << 20, debug=True)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    x = ctx.full((64,), float(rank + 1))
    sent, got = ctx.full((64,), float(rank + 1)), ctx.zeros(64)
    seen = []
    for _ in range(2):  # in debug mode every call is checked across ranks and runs in full: none is replayed
        entered, ran = _entries(lambda: ctx.ccl.all_reduce(x, x))
        seen.append((entered, "first run" in ran, x[0].item()))
        x.fill_(float(rank + 1))
    # send and recv are never checked across ranks: here each rank sends to and receives from a different one
    ctx.ccl.sendrecv(sent, got, dst=(rank + 1) % world, src=(rank - 1) % world)
    ctx.barrier()
    try:
        ctx.ccl.all_reduce(x[: 32 if rank == 0 else 16], x[: 32 if rank == 0 else 16])
        refused = None
    except ValueError as error:
        refused = str(error)
    plans = len(ctx.ccl._plans)
    ctx.close()
    return seen, got[0].item(), refused, plans


@pytest.mark.slow  # debug mode compiles every kernel it launches anew (and the gate cross-compiles each)
def test_debug_mode_checks_every_call_and_replays_none():
    """In rank processes of its own: debug mode compiles its checks into every later kernel of a process, which
    must not reach the shared pool's later tests."""
    w = 2
    with RankPool(w) as pool:
        results = pool.run(_debug_calls)
    for rank, (seen, got, refused, plans) in enumerate(results):
        assert seen == [(["call"], True, w * (w + 1) / 2)] * 2
        assert got == float((rank - 1) % w + 1)
        assert refused is not None and "input_tensor: rank 0 (32,) float32, rank 1 (16,) float32" in refused
        assert plans == 0
