"""Barriers: write -> barrier -> read, round after round, never reads a stale value.

Each round every rank stores a value that is new in this round into its slot
on every rank; after ``ctx.barrier()`` each rank reads all the slots in its own
heap and must see this round's value from every rank. A second barrier keeps
the next round's writes after everyone's reads. The same with ``device_barrier()``
(one kernel on the stream, no host round trip) for all ranks, for each half of
the ranks as a torch.distributed group, both halves at once, and captured once in
a CUDA graph that every later round replays (the round's value lives in memory).
"""

import contextlib
import time

import pytest
import torch
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import iris
from conformance import harness
from conformance.profiles import current


def _round_value(seed: int, round_: int, rank: int) -> int:
    return (seed * 31 + round_ * 1009 + rank * 7 + 1) % (2**31 - 1)


@harness.jit
def _announce_to_kernel(slots, value, cur, members, count, heap_bases):
    for i in range(0, count):
        iris.store(slots + cur, tl.load(value), cur, tl.load(members + i), heap_bases)


def _half_group(rank: int, world: int):
    """(members, torch.distributed group) of this rank's half: evens or odds (every rank makes both)."""
    halves = [tuple(range(parity, world, 2)) for parity in (0, 1)]
    groups = [harness.group(half) for half in halves]
    return list(halves[rank % 2]), groups[rank % 2]


def _barrier_on_rank(case):
    ctx = harness.context()
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    harness.fill_arena(case["seed"])
    slots = harness.region(case["offset"], world, torch.int32)
    members, group = list(range(world)), None
    if case["kind"] == "device_halves":
        members, group = _half_group(rank, world)
    wait = ctx.barrier if case["kind"] == "host" else lambda: ctx.device_barrier(group)
    member_tensor = torch.tensor(members, dtype=torch.int32, device=device)
    value = torch.zeros(1, dtype=torch.int32, device=device)
    snapshot = torch.zeros(world, dtype=torch.int32, device=device)
    ctx.barrier()  # the buffers above are ready, and nobody writes into a heap its owner is still filling

    def one_round():  # in stream order: announce, barrier, read every slot, barrier
        _announce_to_kernel[(1,)](slots, value, rank, member_tensor, len(members), ctx.get_heap_bases())
        wait()
        snapshot.copy_(slots)
        wait()

    graphed = case["kind"] == "device_graph"
    stream = torch.cuda.Stream() if graphed else None
    if graphed:
        stream.wait_stream(torch.cuda.current_stream())  # a side stream does not follow the default one
    graph = None
    violations = []
    jitter = harness.generator(case["seed"], rank, 9)
    for round_ in range(case["rounds"]):
        # A rank that arrives late must still be waited for: stagger the writers.
        time.sleep(float(torch.rand((), generator=jitter)) * case["jitter_ms"] / 1000)
        with torch.cuda.stream(stream) if graphed else contextlib.nullcontext():
            value.fill_(_round_value(case["seed"], round_, rank))
            if graph is None:
                violations += harness.attempt(one_round)  # graphed: the first round also compiles, uncaptured
            else:
                graph.replay()
            if graphed:
                stream.synchronize()
                if graph is None and not violations:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=stream):
                        one_round()  # captured, not run
        seen = snapshot.cpu().tolist()
        stale = [r for r in members if seen[r] != _round_value(case["seed"], round_, r)]
        if stale and len(violations) < 4:
            violations.append(f"round {round_}: after the {case['kind']} barrier the slots of rank(s) {stale} hold "
                              f"{[seen[r] for r in stale]}, expected "
                              f"{[_round_value(case['seed'], round_, r) for r in stale]}")
    ctx.barrier()
    return harness.Verdict(violations)


@pytest.mark.parametrize("kind", ["host", "device", "device_halves",
                                  pytest.param("device_graph", marks=harness.marks_for("cuda_graph"))])
@settings(max_examples=current().examples(1))
@given(data=st.data())
def test_barrier_makes_every_write_visible(world, kind, data):
    """write -> barrier -> read never stale: barrier(), device_barrier(), (group), and replayed in a CUDA graph."""
    case = data.draw(st.fixed_dictionaries(dict(
        kind=st.just(kind), rounds=st.integers(1, current().barrier_rounds), jitter_ms=st.sampled_from((2, 10)),
        offset=harness.offsets(4 * world.size, 4), seed=harness.seeds())), label="case")
    world.check(_barrier_on_rank, case)
