"""The original's July-2025 host names that its examples call: ``iris.do_bench``, ``iris.memset_tensor``,
``ctx.log`` / ``log_debug`` / ``log_stats``, ``ctx.parse_size``, ``ctx.deallocate``, ``ctx.wall_clock_rate``."""

import time

import pytest
import torch

import iris


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
    stats = {}
    for mode in ("mean", "min", "max", "median"):
        delays = iter([0.0] * 2 + [0.001 * k for k in (1, 2, 3, 4, 10)])
        stats[mode] = iris.do_bench(lambda: time.sleep(next(delays)), n_warmup=1, n_repeat=5, return_mode=mode)
    assert stats["min"] < stats["median"] < stats["mean"] < stats["max"]
    assert 0.9 < stats["min"] < 3 and stats["max"] > 9
    delays = iter([0.0] * 2 + [0.001 * k for k in (1, 2, 3, 4, 10)])
    low, mid, high = iris.do_bench(lambda: time.sleep(next(delays)), n_warmup=1, n_repeat=5,
                                   quantiles=[0.0, 0.5, 1.0])
    assert low < mid < high and 2.5 < mid < 5
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
