"""send, recv and sendrecv (iris.ccl.p2p): pairs, rings, many messages in a row, replayed calls, the
original's calls; misuse refused before any launch."""

import pytest
import torch

import iris
from iris.ccl import Config
from iris.testing import refusals


def _pairs_and_rings():
    """Five messages from rank 0 to rank 1 (sizes 1000, 1, 3000, 0, 1000; float32, bfloat16, int32), a ring of
    sendrecv three times, and an exchange both ways ordered by hand."""
    ctx = iris.iris(1 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    seen = {}
    # rank 0 sends to rank 1 several messages of several sizes and dtypes, the same tensor and new ones each time
    for step, (numel, dtype) in enumerate(((1000, torch.float32), (1, torch.bfloat16), (3000, torch.int32),
                                           (0, torch.float32), (1000, torch.float32))):
        x = ctx.full((numel,), -1, dtype=dtype)
        if rank == 0:
            ctx.ccl.send(torch.arange(numel, device=device).to(dtype) + step, dst=1, config=Config(block_size=256))
        elif rank == 1:
            ctx.ccl.recv(x, src=0)
        seen[f"pair {step}"] = x.tolist()
    # a ring, repeated (the second and later calls replay the first's launches), in place of the original's test
    right, left = (rank + 1) % world, (rank - 1) % world
    mine, theirs = ctx.empty(500), ctx.empty(500)
    for step in range(3):
        mine.fill_(100 * step + rank)
        ctx.ccl.sendrecv(mine, theirs, dst=right, src=left, config=Config(block_size=64))
        seen[f"ring {step}"] = theirs.unique().tolist()
    # both directions between 0 and 1, ordered so that neither waits on the other
    back = ctx.zeros(10)
    if rank == 0:
        ctx.ccl.send(torch.full((10,), 7.0, device=device), dst=1)
        ctx.ccl.recv(back, src=1)
    elif rank == 1:
        ctx.ccl.recv(back, src=0)
        ctx.ccl.send(back * 2, dst=0)
    seen["both ways"] = back.unique().tolist()
    ctx.close()
    return seen


@pytest.mark.slow
def test_messages_arrive_whole_and_in_order(ranks):
    results = ranks.run(_pairs_and_rings)
    world = len(results)
    for rank, seen in enumerate(results):
        for step, (numel, value) in enumerate(((1000, None), (1, None), (3000, None), (0, None), (1000, None))):
            want = [float(i + step) for i in range(numel)] if rank == 1 else [-1.0] * numel
            assert seen[f"pair {step}"] == want, (rank, step)
        for step in range(3):
            assert seen[f"ring {step}"] == [float(100 * step + (rank - 1) % world)], (rank, step)
        if rank in (0, 1):
            assert seen["both ways"] == [14.0 if rank == 0 else 7.0], rank


def _the_originals_pair():
    """The original's tests/ccl/test_sendrecv.py pair (one heap tensor, rank 0 fills and sends it, rank 1
    receives into its own), then a ring of sendrecv."""
    ctx = iris.iris(1 << 20)
    rank = ctx.get_rank()
    tensor = ctx.zeros((128, 64), dtype=torch.float16)
    config = Config(block_size_m=32, block_size_n=64)
    ctx.barrier()
    if rank == 0:
        tensor.fill_(42.0)
        ctx.ccl.send(tensor, dst=1, config=config)
    elif rank == 1:
        ctx.ccl.recv(tensor, src=0, config=config)
    ctx.barrier()
    values = tensor.unique().tolist()
    world = ctx.get_num_ranks()
    mine, theirs = ctx.full((100,), float(rank)), ctx.zeros(100)
    ctx.ccl.sendrecv(mine, theirs, dst=(rank + 1) % world, src=(rank - 1) % world)
    ring = theirs.unique().tolist()
    ctx.close()
    return values, ring


def test_the_originals_send_and_recv_calls_and_a_ring(ranks):
    results = ranks.run(_the_originals_pair)
    for rank, (values, ring) in enumerate(results):
        assert values == ([42.0] if rank in (0, 1) else [0.0]), (rank, values)
        assert ring == [float((rank - 1) % len(results))], (rank, ring)


def _misuse():
    ctx = iris.iris(1 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    peer = (rank + 1) % world
    errors = refusals([
        lambda: ctx.ccl.recv(torch.zeros(8, device=device), src=peer),     # the receiving tensor off the heap
        lambda: ctx.ccl.send(ctx.zeros(8), dst=rank),                       # to itself
        lambda: ctx.ccl.recv(ctx.zeros(8), src=world),                      # not a rank
        lambda: ctx.ccl.send(ctx.zeros(8), dst=peer, tag=3),                # tags
        lambda: ctx.ccl.send(ctx.zeros(8).to(torch.float64), dst=peer),     # dtype
    ])
    ctx.close()
    return errors


def test_misuse_is_refused_before_any_launch(ranks):
    for errors in ranks.run(_misuse):
        assert "tensor is not on the symmetric heap" in errors[0], errors
        assert "is this rank" in errors[1], errors
        assert "src=" in errors[2] and "not a member" in errors[2], errors
        assert "only tag 0" in errors[3], errors
        assert "dtype float64" in errors[4], errors
