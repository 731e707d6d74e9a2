"""The rank harness: failures name the rank, exit codes and hangs are reported, the session goes on."""

import os
import time

import pytest

from conformance.harness import Verdict, World
from iris.testing import RankFailure, RankPool


def _pid():
    return os.getpid()


def _fail_on_rank_1():
    if int(os.environ["RANK"]) == 1:
        raise ValueError("planted failure on rank 1")
    return "fine"


def _exit_on_rank_0():
    if int(os.environ["RANK"]) == 0:
        os._exit(7)
    return "fine"


def _hang_on_rank_1():
    if int(os.environ["RANK"]) == 1:
        time.sleep(60)
    return "fine"


def _out_of_memory_on_rank_0():
    if int(os.environ["RANK"]) == 0:
        raise RuntimeError("CUDA error: out of memory")
    return "fine"


def _violation_on_rank_0(case):
    return Verdict([f"saw {case['x']}"] if int(os.environ["RANK"]) == 0 else [], value=case["x"])


def _rank_value(case):
    return Verdict([], value=int(os.environ["RANK"]))


@pytest.fixture(scope="module")
def pool():
    with RankPool(2, timeout=30) as p:
        yield p


def test_exception_names_rank_and_traceback_and_keeps_the_ranks(pool):
    before = pool.run(_pid)
    with pytest.raises(RankFailure) as info:
        pool.run(_fail_on_rank_1)
    assert info.value.failures.keys() == {1}
    assert "planted failure on rank 1" in str(info.value) and "Traceback" in str(info.value)
    assert pool.run(_pid) == before  # every rank answered: no restart


def test_an_out_of_memory_failure_says_how_full_the_machine_was(pool):
    """A rank that ran out of memory (the GPU gate's rare failure at a context's creation) reports the host's
    available memory and, where a GPU tool answers, the GPU's: what ran out, told at the time it did."""
    with pytest.raises(RankFailure) as info:
        pool.run(_out_of_memory_on_rank_0)
    text = info.value.failures[0]
    assert "CUDA error: out of memory" in text
    assert "memory when this failed:\n  host: " in text and "MiB available" in text
    assert 1 not in info.value.failures


@pytest.mark.slow
def test_exit_code_reaches_the_runner_and_the_pool_restarts(pool):
    with pytest.raises(RankFailure) as info:
        pool.run(_exit_on_rank_0)
    assert "exit code 7" in info.value.failures[0]
    assert len(pool.run(_pid)) == 2


@pytest.mark.slow
def test_hang_fails_after_the_timeout_and_the_pool_restarts(pool):
    pool.run(_pid)  # every rank up (a restarted rank still importing torch under load would eat the 3 s)
    started = time.monotonic()
    with pytest.raises(RankFailure) as info:
        pool.run(_hang_on_rank_1, timeout=3)
    assert time.monotonic() - started < 30
    assert "no answer" in info.value.failures[1]
    # where it hung: the rank's Python stack (most recent call first)
    assert "_hang_on_rank_1" in info.value.failures[1] and info.value.failures.keys() == {1}
    assert len(pool.run(_pid)) == 2


def test_a_stack_is_read_once_its_writer_has_paused(tmp_path):
    """faulthandler writes a hung rank's stack in pieces; the driver reads it only once the file stops growing,
    not at its first bytes (CI once showed a stack cut after "File")."""
    import threading

    from iris.testing.ranks import read_when_settled

    path = tmp_path / "rank1.stack"
    path.write_text("Current thread 0x1 (most recent call first):\n  File")

    def finish():
        time.sleep(0.15)
        with open(path, "a") as f:
            f.write(' "tests/test_rank_pool.py", line 30 in _hang_on_rank_1\n')

    writer = threading.Thread(target=finish)
    writer.start()
    texts = read_when_settled({1: str(path)}, deadline=time.monotonic() + 10)
    writer.join()
    assert texts[1].endswith("in _hang_on_rank_1"), texts
    assert read_when_settled({0: str(tmp_path / "none")}, deadline=time.monotonic() + 0.3) == {0: ""}


def test_world_check_reports_rank_case_and_reproduce_line(pool):
    world = World(pool, "ci")
    world.nodeid = "conformance/test_x.py::test_y"
    assert world.check(_rank_value, {}) == [0, 1]
    with pytest.raises(AssertionError) as info:
        world.check(_violation_on_rank_0, {"x": 5})
    text = str(info.value)
    assert "rank 0: saw 5" in text and "case: {'x': 5}" in text
    assert "pytest conformance/test_x.py::test_y --ranks 2 --hypothesis-profile ci" in text


def _fail_on_rank_1_case(case):
    return Verdict([], value=_fail_on_rank_1())


def _hang_when_large(case):
    if case["x"] >= 3 and int(os.environ["RANK"]) == 1:
        time.sleep(60)
    return Verdict([])


@pytest.mark.slow
def test_a_hung_case_is_reported_at_once_not_shrunk(pool):
    """hypothesis shrinks a failing example by running smaller ones; for a hang each would wait out the whole
    time limit and restart the pool (ten minutes or more before any report). A hang ends the property at
    once, with its case, the stack where it hung and the reproduce line; a rank that only waited on a
    failed one is an ordinary failure (shrunk as usual)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from conformance.harness import CaseHung

    world = World(pool, "ci")
    world.nodeid = "conformance/test_x.py::test_hang"
    cases = []

    @settings(max_examples=20, derandomize=True, database=None, deadline=None)
    @given(st.integers(0, 20))
    def prop(x):
        cases.append(x)
        world.check(_hang_when_large, {"x": x}, timeout=2)

    started = time.monotonic()
    with pytest.raises(CaseHung) as info:
        prop()
    assert time.monotonic() - started < 40, "shrunk: every smaller case waited out the limit"
    assert sum(x >= 3 for x in cases) == 1, cases  # the first hung case ended the property
    text = str(info.value)
    assert f"case: {{'x': {cases[-1]}}}" in text and "_hang_when_large" in text and "no answer" in text
    assert "pytest conformance/test_x.py::test_hang --ranks 2" in text
    with pytest.raises(AssertionError) as failed:  # a rank that raised: an AssertionError, peers not "hung"
        world.check(_fail_on_rank_1_case, {})
    assert not isinstance(failed.value, CaseHung)
    assert len(pool.run(_pid)) == 2


_kept = {}


def _return_a_view_of_the_heap():
    import iris

    ctx = iris.iris(1 << 20)
    heap_tensor = ctx.zeros(8)
    _kept["ctx"], _kept["tensor"] = ctx, heap_tensor
    return heap_tensor[:4]  # a view: sending it must not move the heap's storage anywhere


def _heap_tensor_is_still_on_the_heap():
    ctx, heap_tensor = _kept.pop("ctx"), _kept.pop("tensor")
    on_heap = ctx.is_symmetric(heap_tensor)
    ctx.close()
    return on_heap


def test_a_returned_heap_view_leaves_the_heap_where_it_was(pool):
    """Results travel as copies (torch's multiprocessing pickler would move a CPU tensor's storage into
    fresh shared memory, taking a heap tensor off the heap)."""
    values = pool.run(_return_a_view_of_the_heap)
    assert all(v.tolist() == [0.0] * 4 for v in values)
    assert pool.run(_heap_tensor_is_still_on_the_heap) == [True] * pool.world_size
