"""Barriers: write -> barrier -> read, round after round, never reads a stale value.

Each round every rank stores a value that is new in this round into its slot
on every rank; after ``ctx.barrier()`` each rank reads all the slots in its own
heap and must see this round's value from every rank. A second barrier keeps
the next round's writes after everyone's reads. (``device_barrier()`` joins
this file when it lands.)
"""

import torch
import triton
from hypothesis import given, settings
from hypothesis import strategies as st

import iris
from conformance import harness
from conformance.profiles import current


@triton.jit
def _announce_kernel(slots, value, cur, world, heap_bases):
    for to_rank in range(0, world):
        iris.store(slots + cur, value, cur, to_rank, heap_bases)


def _round_value(seed: int, round_: int, rank: int) -> int:
    return (seed * 31 + round_ * 1009 + rank * 7 + 1) % (2**31 - 1)


def _host_barrier_on_rank(case):
    ctx = harness.context()
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    harness.fill_arena(case["seed"])
    slots = harness.region(case["offset"], world, torch.int32)
    ctx.barrier()  # nobody writes into a heap that its owner is still filling
    violations = []
    for round_ in range(case["rounds"]):
        violations += harness.attempt(_announce_kernel[(1,)], slots, _round_value(case["seed"], round_, rank), rank,
                                      world, ctx.get_heap_bases())
        ctx.barrier()
        seen = slots.cpu().tolist()
        want = [_round_value(case["seed"], round_, r) for r in range(world)]
        stale = [r for r in range(world) if seen[r] != want[r]]
        if stale and len(violations) < 4:
            violations.append(f"round {round_}: after barrier() the slots of rank(s) {stale} hold "
                              f"{[seen[r] for r in stale]}, expected {[want[r] for r in stale]}")
        ctx.barrier()
    return harness.Verdict(violations)


@settings(max_examples=current().examples(0.5))
@given(data=st.data())
def test_host_barrier_makes_every_write_visible(world, data):
    case = data.draw(st.fixed_dictionaries(dict(
        rounds=st.integers(1, current().barrier_rounds),
        offset=st.integers(0, (harness.HEAP_BYTES - 4 * world.size) // 4).map(lambda i: i * 4),
        seed=st.integers(0, 2**31 - 1))), label="case")
    world.check(_host_barrier_on_rank, case)
