"""all_to_all_v (iris.ccl.all_to_all_v): device counts, checked against torch.distributed's all_to_all_single
with splits on the same data (gloo on the CPU backend); empty and lopsided splits, rows wider than a block,
replayed calls, fused and not; misuse refused before any launch."""

import pytest
import torch

import iris
from iris.ccl import Config


def _exchanges(steps):
    import torch.distributed as dist

    ctx = iris.iris(4 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    generator = torch.Generator().manual_seed(7)
    # every rank draws every rank's counts alike, so each knows what it will receive (for torch's call)
    failures = []
    for step in range(6):
        counts = torch.randint(0, 9, (world, world), generator=generator)
        if step not in steps:
            continue
        if step == 1:
            counts.zero_()  # nothing at all
        if step == 2:
            counts[:, 0] = 0  # nobody sends to rank 0
        if step == 3:
            counts[:, :] = 0
            counts[:, world - 1] = 40  # every row to the last rank
        width = (1, 5, 130)[step % 3]
        config = Config(block_size=64, fused_bytes=(1 << 20) if step % 2 else 0)
        rows_in = int(counts[rank].sum())
        rows_out = int(counts[:, rank].sum())
        capacity = max(1, int(counts.sum(1).max()))  # the input is allocated alike on every rank (symmetric)
        x = ctx.empty((capacity, width), dtype=torch.float32)
        x.copy_(torch.randn(x.shape, generator=generator))
        out = torch.full((rows_out + 3, width), -5.0, device=device)  # room to spare: the rest stays
        received = torch.full((world,), -1, dtype=torch.int32, device=device)
        splits = counts[rank].to(device)
        ctx.ccl.all_to_all_v(out, x, splits, recv_counts=received, config=config)
        on = device if dist.get_backend() == "nccl" else "cpu"  # where torch's backend takes tensors
        want = torch.empty(rows_out, width, device=on)
        dist.all_to_all_single(want, x[:rows_in].to(on), counts[:, rank].tolist(), counts[rank].tolist())
        want = want.cpu()
        if not torch.equal(out[:rows_out].cpu(), want) or not bool((out[rows_out:] == -5).all()):
            failures.append(("rows", step))
        if received.tolist() != counts[:, rank].tolist():
            failures.append(("received", step, received.tolist()))
    ctx.close()
    return failures


def test_all_to_all_v_matches_torchs_all_to_all_single(ranks):
    for failures in ranks.run(_exchanges, (0,)):
        assert failures == []


@pytest.mark.slow
def test_all_to_all_v_with_empty_lopsided_and_wide_splits_fused_or_not(ranks):
    for failures in ranks.run(_exchanges, range(6)):
        assert failures == []


def _replayed_with_new_counts():
    """The same tensors called again with new counts written into the splits tensor on the device: the replayed
    launches read the new counts (nothing of them was read on the host)."""
    ctx = iris.iris(1 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    x = ctx.empty((4 * world, 2))
    out = torch.zeros(4 * world, 2, device=device)
    splits = torch.zeros(world, dtype=torch.int64, device=device)
    received = torch.zeros(world, dtype=torch.int64, device=device)
    seen = []
    for step in range(1, 4):
        x.copy_((100 * rank + torch.arange(4 * world * 2).reshape(4 * world, 2)).float())
        splits.fill_(step)  # step rows to every member
        ctx.ccl.all_to_all_v(out, x, splits, recv_counts=received)
        seen.append((received.tolist(), out[:step * world].tolist()))
    ctx.close()
    return seen


def test_replayed_calls_read_the_counts_on_the_device(ranks):
    results = ranks.run(_replayed_with_new_counts)
    world = len(results)
    for rank, seen in enumerate(results):
        for step, (received, rows) in enumerate(seen, start=1):
            assert received == [step] * world
            want = [[float(100 * src + 2 * (rank * step + r)), float(100 * src + 2 * (rank * step + r) + 1)]
                    for src in range(world) for r in range(step)]
            assert rows == want, (rank, step)


def _misuse():
    from iris.testing import refusals

    ctx = iris.iris(1 << 20)
    world, device = ctx.get_num_ranks(), ctx.get_device()
    x = ctx.zeros(8, 4)
    splits = torch.ones(world, dtype=torch.int64, device=device)
    errors = refusals([
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 4, device=device), x.clone(), splits),           # off the heap
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 3, device=device), x, splits),                   # row shape
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 4, device=device), x, splits[:1] if world > 1 else splits[:0]),
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 4, device=device), x, splits.float()),           # dtype
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 4, device=device), x, [9] * world),               # too many
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 4, device=device), x, [1] * world, None, [1] * world,
                                     [8] * world),                                                     # past output
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, world, device=device), torch.zeros(8, world, device=device),
                                     output_split_sizes=[1] * world, input_split_sizes=[1] * world),  # off the heap
        lambda: ctx.ccl.all_to_all_v(torch.zeros(4, world, device=device), x.t()[:, :world],
                                     output_split_sizes=[1] * world, input_split_sizes=[1] * world),  # rows strided
    ])
    ctx.close()
    return errors


def test_misuse_is_refused_before_any_launch(ranks):
    for errors in ranks.run(_misuse):
        assert "input is not on the symmetric heap" in errors[0], errors
        assert "rows of one shape and dtype" in errors[1], errors
        assert "one count per member" in errors[2], errors
        assert "one count per member" in errors[3], errors
        assert "input holds 8" in errors[4], errors
        assert "output holds 8" in errors[5], errors
        assert "input is not on the symmetric heap" in errors[6], errors
        assert "input must be contiguous in its rows" in errors[7], errors


def _groups_that_overlap(delay: float):
    """Rank 1 exchanges with rank 2, then with rank 0, which skipped the first exchange and so publishes its
    counts for the second while rank 1 (held back by ``delay`` seconds) has not yet run the first: each call's
    counts must reach its own call (the soak found this at 4 simulated ranks on one GPU)."""
    import time

    import torch.distributed as dist

    ctx = iris.iris(1 << 20)
    rank, device = ctx.get_rank(), ctx.get_device()
    first, second = dist.new_group([1, 2]), dist.new_group([0, 1])
    x = ctx.empty((8, 2))
    x.copy_((10 * rank + torch.arange(16).reshape(8, 2)).float())
    seen = {}
    if rank in (1, 2):
        if rank == 1:
            time.sleep(delay)
        out = torch.full((8, 2), -1.0, device=device)
        counts = torch.tensor([1, 2] if rank == 1 else [3, 1], device=device)  # rows to members 1, 2
        ctx.ccl.all_to_all_v(out, x, counts, group=first)
        seen["first"] = out.tolist()
    if rank in (0, 1):
        out = torch.full((8, 2), -1.0, device=device)
        counts = torch.tensor([2, 3] if rank == 0 else [1, 1], device=device)  # rows to members 0, 1
        ctx.ccl.all_to_all_v(out, x, counts, group=second)
        seen["second"] = out.tolist()
    ctx.barrier()
    ctx.close()
    return seen


def test_calls_of_overlapping_groups_keep_their_counts_apart(three_ranks):
    def rows(src, first, n):
        return [[float(10 * src + 2 * r), float(10 * src + 2 * r + 1)] for r in range(first, first + n)]

    pad = [[-1.0, -1.0]]
    seen = three_ranks.run(_groups_that_overlap, 1.0)
    assert seen[1]["first"] == rows(1, 0, 1) + rows(2, 0, 3) + pad * 4, seen[1]
    assert seen[2]["first"] == rows(1, 1, 2) + rows(2, 3, 1) + pad * 5, seen[2]
    assert seen[0]["second"] == rows(0, 0, 2) + rows(1, 0, 1) + pad * 5, seen[0]
    assert seen[1]["second"] == rows(0, 2, 3) + rows(1, 1, 1) + pad * 4, seen[1]


def _columns():
    """The original's newest form: blocks of columns by split sizes, positional and by keyword, from the leading
    columns of a symmetric buffer; checked against every member's input, which each rank builds, split into its
    column blocks by torch (gloo's all_to_all refuses blocks of different sizes)."""
    import torch.distributed as dist

    ctx = iris.iris(4 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    everyone = dist.new_group(list(range(world)))
    results = []
    for step, dtype in enumerate((torch.float32, torch.bfloat16, torch.float32, torch.float16)):
        m = 5 + step
        sends = [[(i + j + step) % 3 * 4 + 1 for j in range(world)] for i in range(world)]  # member i to j
        inputs = [(i * 1000 + torch.arange(m * sum(sends[i])).reshape(m, sum(sends[i]))).to(dtype)
                  for i in range(world)]
        send, receive = sends[rank], [sends[i][rank] for i in range(world)]
        buffer = ctx.zeros(m, 3 * 4 * world + 3, dtype=dtype)  # alike on every rank; this rank uses a prefix
        x = buffer[:, :sum(send)]
        x.copy_(inputs[rank])
        out = torch.full((m, sum(receive)), -1.0, dtype=dtype, device=device)
        if step == 0:
            ctx.ccl.all_to_all_v(out, x, receive, send)
        elif step == 1:
            ctx.ccl.all_to_all_v(out, x, output_split_sizes=receive, input_split_sizes=send)
        elif step == 2:  # the original's method, its group passed positionally after the sizes
            ctx.ccl.all_to_all_v(out, x, receive, send, everyone)
        else:  # and its group and async_op
            ctx.ccl.all_to_all_v(out, x, receive, send, None, False)
        want = torch.cat([torch.split(inputs[i], sends[i], dim=1)[rank] for i in range(world)], dim=1)
        results.append(torch.equal(out.cpu(), want))
    ctx.close()
    return results


def test_the_originals_column_form_matches_torchs_all_to_all(ranks):
    for results in ranks.run(_columns):
        assert results == [True, True, True, True]


def test_a_column_call_is_told_from_an_mpi_call():
    from iris.ccl.all_to_all_v import is_column_call

    out, x = torch.zeros(4, 6), torch.zeros(4, 10)
    assert is_column_call(out, x, [2, 4], [3, 7], None, None)          # columns: the sums are the widths
    assert not is_column_call(out, x, [2, 4], [0, 2], None, None)      # packed displacements: rows
    assert not is_column_call(out, x, [2, 4], [3, 7], [2, 4], None)    # receive counts: rows
    assert not is_column_call(out.view(-1), x.view(-1), [2, 4], [3, 7], None, None)  # 1-D: rows
