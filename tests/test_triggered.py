"""Triggered transfers (iris.host.triggered): a kernel publishes each block of this rank's slot as it writes it,
the copy queue (a thread here, the copy engine on GPUs) sends it to every peer, and the kernel waits for each
peer's block before summing; several rounds through one plan, at 2 ranks (and 4 in the slow tier)."""

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.device import triggered
from iris.host.triggered import TriggeredPlan
from iris.testing import RankPool, refusals

BLOCK, BLOCKS = 64, 3


@triton.jit
def _produce_and_sum(buffer, out, gates, arrivals, rank, world, round_, BLOCKS: tl.constexpr, BLOCK: tl.constexpr):
    """Program b: this rank's block b (rank * 1000 + round * 100 + b + offs), published; then every rank's block b
    as it arrives, summed into out."""
    b = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mine = buffer + (rank * BLOCKS + b) * BLOCK
    tl.store(mine + offs, (rank * 1000 + round_ * 100 + b + offs).to(tl.float32))
    triggered.publish(gates, rank * BLOCKS + b)
    total = tl.zeros([BLOCK], tl.float32)
    for peer in range(0, world):
        if peer != rank:
            triggered.wait_arrival(arrivals, peer * BLOCKS + b)
        total += tl.load(buffer + (peer * BLOCKS + b) * BLOCK + offs, volatile=True)
    tl.store(out + b * BLOCK + offs, total)


def _expected(world, round_):
    b = torch.arange(BLOCKS).repeat_interleave(BLOCK)
    offs = torch.arange(BLOCK).repeat(BLOCKS)
    blocks = [r * 1000 + round_ * 100 + b + offs for r in range(world)]
    return torch.cat(blocks).float(), sum(blocks).float()


def _rounds(rounds=3):
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    buffer = ctx.zeros(world * BLOCKS * BLOCK)
    schedules = [[((r * BLOCKS + b) * BLOCK, (r * BLOCKS + b + 1) * BLOCK) for b in range(BLOCKS)]
                 for r in range(world)]
    plan = TriggeredPlan(ctx, buffer, schedules, timeout=60)
    assert plan.batch(rank, 1) == rank * BLOCKS + 1
    out = torch.zeros(BLOCKS * BLOCK, device=buffer.device)
    failures = []
    for round_ in range(rounds):
        plan.start()
        _produce_and_sum[(BLOCKS,)](buffer, out, plan.gates, plan.arrivals, rank, world, round_, BLOCKS=BLOCKS,
                                    BLOCK=BLOCK)
        plan.finish()
        gathered, total = _expected(world, round_)
        if not torch.equal(buffer.cpu(), gathered) or not torch.equal(out.cpu(), total):
            failures.append(round_)
    flags = (int(plan.gates.sum()), int(plan.arrivals.sum()))
    plan.close()
    ctx.close()
    return failures, flags


def test_published_blocks_reach_every_peer_round_after_round(ranks):
    for failures, flags in ranks.run(_rounds):
        assert failures == []
        assert flags == (0, 0)  # gates closed by the queue, arrivals cleared by finish


@pytest.fixture(scope="module")
def four_ranks():
    pool = RankPool(4)
    yield pool
    pool.close()


@pytest.mark.slow
def test_published_blocks_reach_every_peer_at_4_ranks(four_ranks):
    for failures, flags in four_ranks.run(_rounds, 2):
        assert failures == [] and flags == (0, 0)


def _refused(case):
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    buffer = ctx.zeros(256)
    schedules = [[(r * 64, r * 64 + 64)] for r in range(world)]
    if case == "off the heap":
        buffer = torch.zeros(256, device=buffer.device)
    elif case == "outside":
        schedules[0] = [(0, 300)]
    elif case == "overlap":
        schedules[1] = [(32, 96)]
    elif case == "not one per rank":
        schedules = schedules[:1]
    elif case == "ranks differ":
        schedules[0] = [(0, 64 if rank == 0 else 32)]
    message, = refusals([lambda: TriggeredPlan(ctx, buffer, schedules)])
    ctx.close()
    return message


REFUSALS = {"off the heap": "rank 0: buffer must be a contiguous tensor on the symmetric heap",
            "outside": "rank 0's batch (0, 300) is not a non-empty range of the 256 elements",
            "overlap": "overlaps rank 1's (32, 96)",
            "not one per rank": "one list of (start, stop) ranges per rank (2)",
            "ranks differ": "ranks [1] passed another buffer size, dtype or schedules than rank 0"}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_plan_that_cannot_work_is_refused_on_every_rank_before_any_copy(ranks, case):
    for message in ranks.run(_refused, case):
        assert REFUSALS[case] in message, message


def _never_published():
    ctx = iris.iris(1 << 20)
    world = ctx.get_num_ranks()
    buffer = ctx.zeros(world * 64)
    plan = TriggeredPlan(ctx, buffer, [[(r * 64, r * 64 + 64)] for r in range(world)], timeout=1)
    plan.start()  # no kernel publishes
    try:
        plan.finish()
        message = None
    except TimeoutError as error:
        message = str(error)
    plan.close()
    ctx.close()
    return message


def test_a_batch_never_published_ends_the_round_with_a_timeout_naming_the_wait(ranks):
    if iris.runtime.get_backend().has_streams:
        pytest.skip("on a GPU the host does not wait for the copy queue: the consumer's wait is what stalls")
    for message in ranks.run(_never_published):
        assert "did not finish within 1 s" in message and "wait_value(" in message, message


@triton.jit
def _produce_block(buffer, gates, rank, round_, PER_BATCH: tl.constexpr, BLOCKS: tl.constexpr, BLOCK: tl.constexpr):
    """Program b writes block b of this rank's slot; each batch is PER_BATCH blocks, published by each writer."""
    b = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    tl.store(buffer + (rank * BLOCKS + b) * BLOCK + offs, (rank * 1000 + round_ * 100 + b + offs).to(tl.float32))
    triggered.publish(gates, rank * (BLOCKS // PER_BATCH) + b // PER_BATCH)


@triton.jit
def _wait_all(arrivals, rank, world, BATCHES: tl.constexpr):
    for batch in range(0, world * BATCHES):
        if batch // BATCHES != rank:
            triggered.wait_arrival(arrivals, batch)


def _batches_of_several_blocks(rounds=2, per_batch=2, blocks=4):
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    buffer = ctx.zeros(world * blocks * BLOCK)
    span = per_batch * BLOCK
    schedules = [[(r * blocks * BLOCK + i * span, r * blocks * BLOCK + (i + 1) * span, per_batch)
                  for i in range(blocks // per_batch)] for r in range(world)]
    plan = TriggeredPlan(ctx, buffer, schedules, timeout=60)
    failures = []
    for round_ in range(rounds):
        plan.start()
        _produce_block[(blocks,)](buffer, plan.gates, rank, round_, PER_BATCH=per_batch, BLOCKS=blocks, BLOCK=BLOCK)
        _wait_all[(1,)](plan.arrivals, rank, world, BATCHES=blocks // per_batch)
        plan.finish()
        b = torch.arange(blocks).repeat_interleave(BLOCK)
        offs = torch.arange(BLOCK).repeat(blocks)
        expected = torch.cat([r * 1000 + round_ * 100 + b + offs for r in range(world)]).float()
        if not torch.equal(buffer.cpu(), expected):
            failures.append(round_)
    plan.close()
    ctx.close()
    return failures


def test_a_batch_of_several_blocks_goes_once_each_writer_published(ranks):
    assert ranks.run(_batches_of_several_blocks) == [[]] * ranks.world_size
