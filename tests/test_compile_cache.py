"""CompileOnceCacheManager: of the processes that miss one kernel at once, one compiles and the rest wait."""

import multiprocessing as mp
import time

import pytest

from iris.runtime import compile_cache

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)


def _miss_then_store(cache_dir: str, started, results) -> None:
    """What triton.compile does with its cache: look the kernel up; on a miss, compile (here: 1 s) and store."""
    import os

    os.environ["TRITON_CACHE_DIR"] = cache_dir
    manager = compile_cache.CompileOnceCacheManager("samekernel")
    started.wait()
    group = manager.get_group("kernel.json")
    if group is None:
        time.sleep(1.0)
        path = manager.put(b"{}", "kernel.json", binary=True)
        manager.put_group("kernel.json", {"kernel.json": path})
        results.put("compiled")
    else:
        results.put("loaded")


def test_one_process_compiles_the_others_load(tmp_path):
    ctx = mp.get_context("spawn")
    started, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_miss_then_store, args=(str(tmp_path), started, results)) for _ in range(3)]
    for proc in procs:
        proc.start()
    time.sleep(2.0)  # every process is importing and then waiting on the event
    started.set()
    outcomes = sorted(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(timeout=30)
    assert outcomes == ["compiled", "loaded", "loaded"]


def test_a_lock_held_too_long_is_not_waited_on_forever(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compile_cache, "WAIT_S", 0.3)
    holder = compile_cache.CompileOnceCacheManager("stuck")
    assert holder.get_group("kernel.json") is None  # holds the lock and never stores
    started = time.monotonic()
    assert compile_cache.CompileOnceCacheManager("stuck").get_group("kernel.json") is None
    assert time.monotonic() - started < 5
