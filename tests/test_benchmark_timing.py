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


def pilot_timer(per_call_us: float, start_us: float, calls: list, late_us: float = 0.0, slow=None):
    """A sample of ``n`` calls of ``per_call_us`` each, as the GPU times it: ``start_us`` of start (the first
    launches on an idle GPU, the peer's first launch) plus the calls; the first pilot also waits ``late_us``
    for a peer still in the host's broadcast of the last batch size; ``slow``: the pilots (by number) that
    fall in a spell and take twice as long. Returns microseconds per call; records each pilot's size in
    ``calls``."""
    def time_batch(n: int) -> float:
        calls.append(n)
        total = start_us + n * per_call_us + (late_us if len(calls) == 1 else 0.0)
        return total * (2 if slow and len(calls) in slow else 1) / n
    return time_batch


def test_the_batch_holds_a_sample_of_calls_whatever_each_sample_costs_to_start(results):
    """5 us calls, 200 us samples: 40 calls a sample, though every sample (pilots too) starts 10 us late.
    Sized from a pilot's time per call, it would be 200 / (5 + 10 / n): a short batch, whose samples then
    spread the start over few calls (on 2 x H200: 10-28 calls for a 6 us all_reduce, 2 for NCCL)."""
    calls = []
    assert results.batch_size(200.0, None, pilot_timer(5.0, 10.0, calls)) == 40


def test_a_sample_lasts_ten_times_what_starting_it_costs(results):
    """30 us calls whose samples start 100 us late: 34 calls (the start a tenth of the sample at most), not the
    7 that 200 us of calls would be (each call's figure would carry 14 us of start); 5 us calls that start 100 us
    late: 200; never past MAX_CALLS."""
    assert results.batch_size(200.0, None, pilot_timer(30.0, 100.0, [])) == 34
    assert results.batch_size(200.0, None, pilot_timer(5.0, 100.0, [])) == 200
    assert results.batch_size(200.0, None, pilot_timer(1.0, 1000.0, [])) == results.MAX_CALLS


def test_a_peer_late_for_the_first_pilot_does_not_shrink_the_batch(results):
    """The first pilot also waits 300 us for a peer (taken alone, 3 calls of it say 105 us a call: a batch of 2)."""
    calls = []
    assert results.batch_size(200.0, None, pilot_timer(5.0, 10.0, calls, late_us=300.0)) == 40


def test_a_spell_in_one_pilot_does_not_shrink_the_batch(results):
    for spell in range(1, 5):
        calls = []
        assert results.batch_size(200.0, None, pilot_timer(5.0, 10.0, calls, slow={spell})) >= 40, spell


def test_every_rank_runs_the_same_pilots_and_takes_rank_0s_batch(results):
    """Ranks that time a collective must all run the same calls: the pilots' sizes are fixed or agreed, and the
    batch is rank 0's."""
    agreed, calls = [], []

    def agree(value):
        agreed.append(value)
        return value if len(agreed) == 1 else 7  # rank 0's batch wins

    assert results.batch_size(200.0, agree, pilot_timer(5.0, 10.0, calls)) == 7
    assert calls == [3, 3, 23, 23] and len(agreed) == 2


def test_calls_far_longer_than_a_sample_take_no_long_pilot(results):
    """A call of 10 ms against 200 us samples: one call a sample, found from the short pilots alone (ranks agree)."""
    calls = []
    assert results.batch_size(200.0, lambda value: value, pilot_timer(10_000.0, 10.0, calls)) == 1
    assert calls == [3, 3]


def test_batches_stay_between_1_and_100_calls(results):
    assert results.batch_size(200.0, None, lambda n: 0.5) == 100
    assert results.batch_size(200.0, None, lambda n: 500.0) == 1


def test_no_sample_time_means_one_call_a_sample_and_no_pilot(results):
    assert results.batch_size(0.0, None, lambda n: pytest.fail("a pilot ran")) == 1


@pytest.fixture(scope="module")
def timing():
    return import_benchmark("_timing")


def test_every_implementation_gets_the_same_warmup_then_samples_in_turns_each_after_the_ranks_meet(timing):
    order = []
    impls = {name: (lambda name=name: order.append(name)) for name in ("iris", "nccl")}
    timer = timing.Timer(gpu=False, calls=3, samples=2, warmup=4, meet=lambda: order.append("meet"))
    figures = timer.per_call_us(impls, "eager")
    assert list(figures) == ["iris", "nccl"]
    assert order[:8] == ["iris"] * 4 + ["nccl"] * 4
    sample = lambda name: ["meet"] + [name] * 3  # noqa: E731
    assert order[8:] == (sample("iris") + sample("nccl")) * 2


def test_the_eager_figure_is_the_median_of_the_wall_clock_over_each_samples_calls(timing):
    now = [0.0]
    lengths = iter([3e-6, 9e-6, 6e-6])  # one call each: samples of 3 calls lasting 9, 27 and 18 us

    def call():
        now[0] += step[0]

    step = [0.0]

    def meet():
        step[0] = next(lengths)

    timer = timing.Timer(gpu=False, calls=3, samples=3, warmup=0, meet=meet, clock=lambda: now[0])
    assert timer.per_call_us({"only": call}, "eager") == {"only": pytest.approx(6.0)}


def test_the_cpu_backend_has_only_the_eager_method_and_bad_settings_are_refused(timing):
    timer = timing.Timer(gpu=False)
    assert timer.methods() == ("eager",)
    with pytest.raises(ValueError, match="this timer takes eager"):
        timer.per_call_us({"x": lambda: None}, "device")
    assert timing.Timer(gpu=True).methods() == ("device", "eager", "graph")
    with pytest.raises(ValueError, match="calls >= 1"):
        timing.Timer(gpu=False, calls=0)


def test_a_small_message_whose_device_figure_is_over_twice_its_graph_figure_is_suspect(timing):
    assert timing.suspect(63.0, 6.6, 1024)  # NCCL's eager 1 KiB figure before the method was one for all
    assert not timing.suspect(12.0, 6.6, 1024)
    assert not timing.suspect(63.0, 6.6, 1 << 20)  # large messages: the graph saves only launches
    assert not timing.suspect(63.0, "", 1024)  # no graph figure, nothing to hold it against
