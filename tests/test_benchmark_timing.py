"""benchmarks/_results.py's timing: what it promises about the order in which it takes samples."""

import pytest
from benchmark_runs import import_benchmark


@pytest.fixture(scope="module")
def results():
    return import_benchmark("_results")


def test_interleaved_timing_takes_every_calls_samples_in_turns(results):
    """Sample i of every call comes before sample i + 1 of any, so that calls compared in one table
    see the same clocks (a GPU at its power limit clocks lower the longer it has been busy)."""
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in ("fused", "cublas", "nccl")}
    figures = results.interleaved_median_us(calls, warmup=2, iters=4, gpu=False)
    assert list(figures) == ["fused", "cublas", "nccl"] and all(us > 0 for us in figures.values())
    warm, timed = order[:6], order[6:]
    assert sorted(warm) == sorted(["fused", "cublas", "nccl"] * 2)
    assert timed == ["fused", "cublas", "nccl"] * 4


def test_interleaved_timing_of_one_call_is_the_median_of_its_samples(results):
    ticks = iter([0.0, 1e-6, 1e-6, 4e-6, 4e-6, 6e-6])  # samples of 1, 3 and 2 us
    figures = results.interleaved_median_us({"only": lambda: None}, warmup=0, iters=3, gpu=False,
                                            clock=lambda: next(ticks))
    assert figures == {"only": pytest.approx(2.0)}


def test_settling_runs_the_calls_in_turns_for_about_the_time_asked_before_any_sample(results):
    order, now = [], [0.0]

    def clock():
        return now[0]

    def call(name):
        order.append(name)
        now[0] += 1e-3  # each call takes 1 ms of the fake clock

    calls = {name: (lambda name=name: call(name)) for name in ("fused", "cublas")}
    results.interleaved_median_us(calls, warmup=0, iters=1, gpu=False, settle_ms=10, clock=clock)
    assert order == ["fused", "cublas"] * 5 + ["fused", "cublas"]  # 5 rounds of 2 ms settle, then 1 sample each
