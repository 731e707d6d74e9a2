"""The CPU backend's heap is a sparse range of shared memory: a rank may reserve far more than the machine holds
(the original's programs ask for 64 GiB per rank), pages are backed as allocations touch them, and an allocation
past what the machine can back is refused by a MemoryError before anything is touched (never a SIGBUS later)."""

import pytest
import torch

import iris
from iris.runtime import SELECTED, shm

pytestmark = pytest.mark.skipif(SELECTED != "cpu", reason="the CPU backend's shared-memory heap")

HUGE = 64 << 30


def _huge_heap_on_rank():
    ctx = iris.iris(HUGE)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    before = ctx.heap_usage()
    x, out = ctx.full((1024,), float(rank + 1)), ctx.zeros(1024)
    ctx.ccl.all_reduce(out, x)  # the peers' heaps, through translation, at the start of a 64 GiB range
    summed = out.sum().item()
    after = ctx.heap_usage()
    refused = None
    try:
        ctx.empty(after["backable"] - after["allocated"] + 4096, dtype=torch.uint8)
    except MemoryError as error:
        refused = str(error)
    still = ctx.zeros(16).add_(1).sum().item()  # the refusal touched nothing and left the heap usable
    ctx.close()
    return world, before, after, summed, refused, still


def test_a_64_gib_heap_per_rank_reserves_its_range_and_backs_what_allocations_touch(ranks):
    capacity = shm.backing_capacity()
    for world, before, after, summed, refused, still in ranks.run(_huge_heap_on_rank):
        assert before["reserved"] >= HUGE and before["allocated"] == 0
        assert summed == 1024 * sum(range(1, world + 1)) and still == 16
        assert after["allocated"] >= 2 * 1024 * 4 and after["reserved"] == before["reserved"]
        if capacity is not None and capacity < world * HUGE:  # this machine cannot back every rank's 64 GiB
            assert after["backable"] < HUGE
            assert refused is not None and "backs them on first touch" in refused and "/dev/shm" in refused, refused
