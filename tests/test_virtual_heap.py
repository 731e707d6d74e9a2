"""The virtual-memory heap (``allocator_type="vmem"``): each rank reserves its whole range, backs chunks as the
allocations grow and maps its peers' chunks at the same offsets, sharing them as file descriptors over Unix
sockets. On the CPU backend the chunks are memfds; on a GPU, the driver's virtual-memory chunks."""

import os
import uuid

import pytest
import torch

import iris
from iris.runtime.descriptors import DescriptorExchange

HUGE = 64 << 30


def _exchange_on_rank():
    ctx = iris.iris(1 << 20)
    comm, rank = ctx.comm, ctx.get_rank()
    tag = comm.broadcast_object(uuid.uuid4().hex if rank == 0 else None, src=0)
    exchange = DescriptorExchange(comm, f"test_{tag}")
    fd = os.memfd_create("iris_test")
    os.ftruncate(fd, 4096)
    os.pwrite(fd, f"written by rank {rank}".encode(), 0)
    got = exchange.round({"note": rank * 10}, fd)
    os.close(fd)
    seen = {}
    for peer, (header, peer_fd) in got.items():
        seen[peer] = (header["rank"], header["note"], os.pread(peer_fd, 32, 0).rstrip(b"\0").decode())
        os.pwrite(peer_fd, f"answered by rank {rank}".encode(), 100 + 32 * rank)  # the same memory as the peer's
        os.close(peer_fd)
    without = exchange.round({"failure": "none to give"}, None)
    exchange.close()
    ctx.close()
    return rank, seen, {p: (h["failure"], f) for p, (h, f) in without.items()}


def test_a_descriptor_round_gives_every_rank_each_peers_descriptor_and_header(ranks):
    results = ranks.run(_exchange_on_rank)
    world = len(results)
    for rank, seen, without in results:
        assert sorted(seen) == [r for r in range(world) if r != rank]
        for peer, (header_rank, note, text) in seen.items():
            assert (header_rank, note, text) == (peer, peer * 10, f"written by rank {peer}")
        assert without == {p: ("none to give", None) for p in seen}


def _a_round_ahead_on_rank():
    import time

    ctx = iris.iris(1 << 20)
    comm, rank = ctx.comm, ctx.get_rank()
    tag = comm.broadcast_object(uuid.uuid4().hex if rank == 0 else None, src=0)
    exchange = DescriptorExchange(comm, f"test_{tag}")
    seen = []
    if rank == 0:  # reaches rank 1 at once and rank 2 late: rank 1 finishes round 1 and sends rank 2 its round 2
        payload = exchange._next_round({"number": 0})
        exchange._send(1, payload, None)
        time.sleep(0.5)
        exchange._send(2, payload, None)
        got = exchange._collect("round 1")
        seen.append(sorted((peer, header["number"]) for peer, (header, _) in got.items()))
    for number in range(1 if rank == 0 else 0, 3):
        got = exchange.round({"number": number}, None)
        seen.append(sorted((peer, header["number"]) for peer, (header, _) in got.items()))
    exchange.close()
    ctx.close()
    return rank, seen


def test_rounds_stay_apart_when_a_peer_runs_a_round_ahead(three_ranks):
    for rank, seen in three_ranks.run(_a_round_ahead_on_rank):
        peers = [r for r in range(3) if r != rank]
        assert seen == [[(peer, number) for peer in peers] for number in range(3)]


def _growing_heap_on_rank():
    ctx = iris.iris(HUGE, allocator_type="vmem")
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    first = ctx.heap_usage()
    bases = list(ctx.heap.bases)
    small, small_out = ctx.full((1024,), float(rank + 1)), ctx.zeros(1024)
    big = ctx.zeros(5 << 20, dtype=torch.float32)  # 20 MiB: past the chunks backed so far
    big[-1] = rank + 1
    late, late_out = ctx.full((256,), float(10 * (rank + 1))), ctx.zeros(256)  # in the chunk the growth mapped
    ctx.ccl.all_reduce(small_out, small)
    ctx.ccl.all_reduce(late_out, late)
    grown = ctx.heap_usage()
    same_bases = list(ctx.heap.bases) == bases
    result = (rank, world, ctx.allocator_type, first, grown, same_bases, small_out.sum().item(),
              late_out.sum().item(), big[-1].item())
    ctx.close()
    return result


def test_the_vmem_heap_backs_what_allocations_reach_and_peers_see_every_chunk(ranks):
    for rank, world, allocator, first, grown, same_bases, small, late, last in ranks.run(_growing_heap_on_rank):
        total = sum(range(1, world + 1))
        assert allocator == "vmem" and same_bases
        assert first["reserved"] >= HUGE and first["allocated"] == 0
        assert first["backed"] < 64 << 20, first  # the reserved regions and a first chunk, not 64 GiB
        assert grown["allocated"] > 20 << 20 and grown["allocated"] <= grown["backed"] < 128 << 20, grown
        assert small == 1024 * total and late == 256 * 10 * total and last == rank + 1


def _mismatched_growth_on_rank():
    ctx = iris.iris(1 << 30, allocator_type="vmem")
    rank = ctx.get_rank()
    try:
        ctx.empty((8 << 20) * (rank + 1), dtype=torch.uint8)  # rank 1 asks for more than rank 0
        error = None
    except RuntimeError as caught:
        error = str(caught)
    ctx.close()
    return rank, error


def test_ranks_that_grow_the_heap_differently_get_an_error_naming_both(ranks):
    for rank, error in ranks.run(_mismatched_growth_on_rank):
        assert error is not None and "backs heap bytes" in error and "same allocations in the same order" in error
        other = 1 if rank == 0 else 0
        assert f"rank {rank} backs" in error and f"rank {other} backs" in error, error


def _torch_heap_on_rank():
    ctx = iris.iris(64 << 20, allocator_type="torch")
    usage = ctx.heap_usage()
    result = ctx.allocator_type, usage["reserved"], usage["backed"]
    ctx.close()
    return result


def test_allocator_torch_backs_the_heap_up_front_or_as_touched(ranks):
    for allocator, reserved, backed in ranks.run(_torch_heap_on_rank):
        assert allocator == "torch"
        assert 0 < backed <= reserved  # the CPU backend's shared memory backs touched pages; a GPU's, all of it


def test_an_unknown_allocator_in_the_environment_is_refused_before_any_allocation(monkeypatch):
    monkeypatch.setenv("IRIS_ALLOCATOR", "slab")
    with pytest.raises(ValueError, match="IRIS_ALLOCATOR='slab' is not an allocator; use one of torch, vmem"):
        iris.iris(1 << 16)
