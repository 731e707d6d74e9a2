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
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 4, device=device), x, [-1] + [1] * (world - 1)),  # negative
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 4, device=device), x, [1.5] * world),              # not whole
        lambda: ctx.ccl.all_to_all_v(torch.zeros(8, 4, device=device), x, [1] * world, [0, -2] + [0] * (world - 2)),
        lambda: ctx.as_symmetric([1, 2, 3]),                                                            # no tensor
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
        assert "send_counts must be whole numbers >= 0; got [-1" in errors[8], errors
        assert "send_counts must be whole numbers >= 0; got [1.5" in errors[9], errors
        assert "send_displs must be whole numbers >= 0; got [0, -2" in errors[10], errors
        assert "as_symmetric takes a torch.Tensor; got list" in errors[11], errors


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
    from iris.compat.ccl import is_column_call

    out, x = torch.zeros(4, 6), torch.zeros(4, 10)
    assert is_column_call(out, x, [2, 4], [3, 7], None, None)          # columns: the sums are the widths
    assert not is_column_call(out, x, [2, 4], [0, 2], None, None)      # packed displacements: rows
    assert not is_column_call(out, x, [2, 4], [3, 7], [2, 4], None)    # receive counts: rows
    assert not is_column_call(out.view(-1), x.view(-1), [2, 4], [3, 7], None, None)  # 1-D: rows


def _adapter_beside_the_method():
    """iris.compat.ccl.all_to_all_v called on ``ctx.ccl`` directly and ``ctx.ccl.all_to_all_v``, each of the
    original's forms on the same data: columns by position, by keyword, with group and async_op after the sizes;
    rows by list, by device counts with received counts, by MPI's four lists, with the group fifth. Every rank draws
    every rank's input alike, so each builds what it must receive."""
    import torch.distributed as dist

    from iris.compat.ccl import all_to_all_v

    ctx = iris.iris(4 << 20)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    everyone = dist.new_group(list(range(world)))
    generator = torch.Generator().manual_seed(11)
    calls = (lambda *args, **kwargs: all_to_all_v(ctx.ccl, *args, **kwargs), ctx.ccl.all_to_all_v)
    results = {}

    m, sends = 6, [[(i + 2 * j) % 3 * 4 + 1 for j in range(world)] for i in range(world)]  # columns i -> j
    inputs = [torch.randn(m, sum(sends[i]), generator=generator) for i in range(world)]
    send, receive = sends[rank], [sends[i][rank] for i in range(world)]
    x = ctx.zeros(m, 9 * world)[:, :sum(send)]  # leading columns of a buffer alike on every rank
    x.copy_(inputs[rank])
    want = torch.cat([torch.split(inputs[i], sends[i], dim=1)[rank] for i in range(world)], dim=1)
    for form, args, kwargs in [("positional", (receive, send), {}),
                               ("keyword", (), dict(output_split_sizes=receive, input_split_sizes=send)),
                               ("group after the sizes", (receive, send, everyone), {}),
                               ("group, async_op after the sizes", (receive, send, None, False), {}),
                               ("config", (receive, send), dict(config=Config(block_size=64)))]:
        outs = [torch.full((m, sum(receive)), -1.0, device=device) for _ in calls]
        for call, out in zip(calls, outs):
            call(out, x, *args, **kwargs)
        results["columns " + form] = [torch.equal(out.cpu(), want) for out in outs]

    counts = torch.randint(0, 5, (world, world), generator=generator)  # rows i -> j
    rows = [torch.randn(5 * world, 3, generator=generator) for _ in range(world)]
    xr = ctx.empty((5 * world, 3))
    xr.copy_(rows[rank])
    mine = [int(c) for c in counts[:, rank]]
    want = torch.full((5 * world, 3), -1.0)
    want[:sum(mine)] = torch.cat([rows[i][int(counts[i, :rank].sum()):][:mine[i]] for i in range(world)])
    sent = counts[rank].tolist()
    packed = [sum(sent[:j]) for j in range(world)]
    received = [torch.zeros(world, dtype=torch.int64, device=device) for _ in calls]
    for form, args, kwargs in [("list", (sent,), {}), ("device counts", (counts[rank].to(device),), {}),
                               ("MPI", (sent, packed, mine, [sum(mine[:i]) for i in range(world)]), {}),
                               ("group fifth", (sent, None, everyone), {})]:
        outs = [torch.full((5 * world, 3), -1.0, device=device) for _ in calls]
        for call, out, got in zip(calls, outs, received):
            call(out, xr, *args, **(dict(recv_counts=got) if form == "device counts" else kwargs))
        results["rows " + form] = [torch.equal(out.cpu(), want) for out in outs]
    results["received"] = [got.tolist() == mine for got in received]

    errors = []
    for call in calls:
        for args, kwargs in [((receive, send), dict(output_split_sizes=receive, input_split_sizes=send)), ((), {})]:
            try:
                call(torch.zeros(m, sum(receive), device=device), x, *args, **kwargs)
                errors.append(None)
            except TypeError as exc:
                errors.append(str(exc))
    ctx.close()
    return results, errors


def test_the_compat_adapter_takes_every_form_as_the_method_does(ranks):
    for rank, (results, errors) in enumerate(ranks.run(_adapter_beside_the_method)):
        assert all(both == [True, True] for both in results.values()), (rank, results)
        assert len(results) == 10
        assert errors[0] == errors[2] and "not both" in errors[0], errors
        assert errors[1] == errors[3] and "send_counts (or output_split_sizes" in errors[1], errors


def test_the_compat_adapter_routes_each_form(monkeypatch):
    """Which call each form becomes: the column function with the sizes, group, async_op and config recognised,
    or the native method with the rest (no ranks: both stand-ins record their arguments)."""
    import types

    from iris.compat import ccl as compat

    made = []
    monkeypatch.setattr(compat, "_native_all_to_all_v", lambda *args, **kwargs: made.append(("rows", args, kwargs)))
    monkeypatch.setattr(compat.a2av, "all_to_all_v_columns",
                        lambda *args, **kwargs: made.append(("columns", args, kwargs)))
    ctx = types.SimpleNamespace(team=types.SimpleNamespace(debug=False))
    me = types.SimpleNamespace(_ctx=ctx)
    out, x, narrow, config = torch.zeros(4, 6), torch.zeros(4, 10), torch.zeros(4, 2), Config(block_size=64)
    plain = dict(group=None, async_op=False, config=None)
    cases = [
        ((out, x, [1, 5], [1, 9]), {}, ("columns", (out, x, ctx, [1, 5], [1, 9]), plain)),
        ((out, x), dict(output_split_sizes=[1, 5], input_split_sizes=[1, 9]),
         ("columns", (out, x, ctx, [1, 5], [1, 9]), plain)),
        ((out, x, [1, 5], [1, 9], None, True, config), {},
         ("columns", (out, x, ctx, [1, 5], [1, 9]), dict(group=None, async_op=True, config=config))),
        ((out, x, [3, 3]), {}, ("rows", (me, out, x, [3, 3], None, None, None), plain)),
        ((out, x, [1, 5], [0, 1]), {}, ("rows", (me, out, x, [1, 5], [0, 1], None, None), plain)),  # displacements
        ((out, narrow, [2, 4], [0, 2]), {},  # the widths fit either form: packed displacements say rows
         ("rows", (me, out, narrow, [2, 4], [0, 2], None, None), plain)),
        ((out, x, [2, 2], [0, 2], [2, 2], [0, 2]), {}, ("rows", (me, out, x, [2, 2], [0, 2], [2, 2], [0, 2]), plain)),
        ((out, x, [3, 3], None, None, True), {},
         ("rows", (me, out, x, [3, 3], None, None, None), dict(group=None, async_op=True, config=None))),
    ]
    for args, kwargs, want in cases:
        made.clear()
        compat.all_to_all_v(me, *args, **kwargs)
        assert made == [want], (args, kwargs, made)
    with pytest.raises(TypeError, match="not both"):
        compat.all_to_all_v(me, out, x, [1, 5], output_split_sizes=[1, 5], input_split_sizes=[1, 9])
    with pytest.raises(TypeError, match="send_counts .or output_split_sizes and input_split_sizes. is required"):
        compat.all_to_all_v(me, out, x)
