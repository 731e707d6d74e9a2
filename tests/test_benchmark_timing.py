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


def late_peer_timer(per_call_us: float, late_us: float, calls: list):
    """The GPU's microseconds per call of a batch of ``n`` calls of ``per_call_us`` each, where the first batch
    also waits ``late_us`` for a peer that left the host's broadcast of the batch size after this rank
    (what a pilot timed without a device barrier before it sees); records each batch's size in ``calls``."""
    def time_batch(n: int) -> float:
        calls.append(n)
        return (n * per_call_us + (late_us if len(calls) == 1 else 0.0)) / n
    return time_batch


def test_a_peer_late_for_the_first_pilot_does_not_shrink_the_batch(results):
    """5 us calls, 200 us samples: 40 calls a sample, though the first 3-call pilot waited 300 us for a peer
    (taken alone it says 105 us a call: a batch of 2, whose samples would carry their start's cost twenty-fold)."""
    calls = []
    batch = results.batch_size(200.0, None, late_peer_timer(5.0, 300.0, calls))
    assert batch == 40
    assert calls[0] == 3 and calls[-1] == 40  # the last pilot is a sample's size: its start is spread as a sample's


def test_the_batch_comes_from_the_least_time_per_call_any_pilot_saw(results):
    """A spell that slows a later pilot does not undo what an earlier one measured (extra time only ever
    adds to a batch's time per call)."""
    figures = iter([5.0, 5.0, 20.0])
    calls = []
    batch = results.batch_size(200.0, None, lambda n: calls.append(n) or next(figures))
    assert batch == 40 and len(calls) == 3


def test_every_rank_runs_the_pilot_sizes_rank_0_agreed(results):
    """Ranks that time a collective must all run the same calls: each pilot's size is agreed before it runs."""
    agreed, calls = [], []

    def agree(batch):
        agreed.append(batch)
        return 7  # rank 0's choice wins

    assert results.batch_size(200.0, agree, late_peer_timer(5.0, 0.0, calls)) == 7
    assert calls == [3, 7, 7] and len(agreed) == 3


def test_batches_stay_between_1_and_100_calls(results):
    assert results.batch_size(200.0, None, lambda n: 0.5) == 100
    assert results.batch_size(200.0, None, lambda n: 5000.0) == 1


def test_no_sample_time_means_one_call_a_sample_and_no_pilot(results):
    assert results.batch_size(0.0, None, lambda n: pytest.fail("a pilot ran")) == 1
