"""all_gather_matmul's ways of sending against a float64 reference: copies, the vendor's GEMM, pushes by
the programs, the last round split by member slice."""

import pytest
import torch

import iris
from iris.ops import FusedConfig
from iris.testing import refusals
from iris.testing.fused_ops import copy_refusal_in, shapes
from fused_op_runs import (TOLERANCE, parts_handed_over, run_op, run_op_with_free_parts, skip_where_copies_are_refused,
                           takes_tma)


def test_all_gather_matmul_with_slices_sent_by_copies_matches_float64(ranks):
    """FusedConfig(copy_engine=True): A's slices travel by whole copies (the copy engine on a GPU, a copy
    between the mapped heaps here) after an entry barrier, with an arrival flag each, over calls that
    reuse the workspace (the flags are cleared after each call)."""
    skip_where_copies_are_refused(ranks)
    config = FusedConfig(copy_engine=True)
    for shape, out_dtype in (((40, 70, 24), torch.float32), ((64, 32, 50), torch.bfloat16)):
        for rank, errors in enumerate(ranks.run(run_op, "all_gather_matmul", *shape, out_dtype,
                                                out_dtype == torch.float32, seeds=[1, 2, 3], config=config)):
            assert max(errors) <= TOLERANCE[out_dtype], f"rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("config", [FusedConfig(copy_engine=True), FusedConfig(vendor_gemm=True)],
                         ids=["kernel", "vendor_gemm"])
def test_all_gather_matmul_by_copies_at_three_ranks_matches_float64(three_ranks, config):
    """By copies at 3 ranks (each member's slice from the two others): Iris's kernel and the vendor's GEMM."""
    skip_where_copies_are_refused(three_ranks)
    for rank, errors in enumerate(three_ranks.run(run_op, "all_gather_matmul", 40, 72, 24, torch.bfloat16, True,
                                                  seeds=[6, 7], config=config)):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"rank {rank}: relative errors {errors}"


def test_all_gather_matmul_by_the_vendor_gemm_matches_float64(ranks):
    """FusedConfig(vendor_gemm=True): A's slices travel by whole copies with an arrival flag each, torch's
    GEMM multiplies this rank's slice (with the bias) and adds each member's product once its flag is seen;
    over calls that reuse the workspace (the flags cleared after each), into an output of A's dtype."""
    skip_where_copies_are_refused(ranks)
    config = FusedConfig(vendor_gemm=True)
    assert all(ranks.run(_takes_vendor_gemm, 64, 32, 50, torch.bfloat16, config))
    for with_bias in (True, False):
        for rank, errors in enumerate(ranks.run(run_op, "all_gather_matmul", 64, 32, 50, torch.bfloat16, with_bias,
                                                seeds=[1, 2, 3], config=config)):
            assert max(errors) <= TOLERANCE[torch.bfloat16], f"rank {rank}: relative errors {errors}"


def _takes_vendor_gemm(m, n, k, out_dtype, config):
    """Whether all_gather_matmul's workspace for this problem is the vendor GEMM's (no tile parts to hand over)."""
    ctx = iris.iris(1 << 20)
    world, device = ctx.get_num_ranks(), ctx.get_device()
    a_shape, b_shape, out_shape = shapes("all_gather_matmul", m, n, k, world)
    a, b = (torch.zeros(*shape, dtype=torch.bfloat16, device=device) for shape in (a_shape, b_shape))
    key, spec = ctx.ops.workspace_layout("all_gather_matmul", torch.zeros(out_shape, dtype=out_dtype,
                                                                           device=device), a, b, config)
    ctx.close()
    return "vendor_gemm" in key and set(spec) == {"gathered", "flags"}


def test_all_gather_matmul_takes_the_vendor_gemm_by_default_where_it_can_go(ranks):
    """vendor_gemm=None (default): the vendor's GEMM for a bfloat16 output of bfloat16 operands where copies can
    go, unless the call sets one of Iris's kernel's knobs (copy_engine, tma_loads, split_k); Iris's kernel for a
    float32 output and with vendor_gemm=False. True: the vendor's GEMM, refused before any launch where the
    output's dtype is not A's (torch's GEMM writes A's dtype) or the copies cannot go."""
    copies = copy_refusal_in(ranks) is None
    bf16 = torch.bfloat16
    cases = [(bf16, FusedConfig(), copies), (torch.float32, FusedConfig(), False),
             (bf16, FusedConfig(vendor_gemm=False), False), (bf16, FusedConfig(copy_engine=True), False),
             (bf16, FusedConfig(tma_loads=False), False), (bf16, FusedConfig(split_k=2), False)]
    for out_dtype, config, expected in cases:
        assert ranks.run(_takes_vendor_gemm, 64, 32, 50, out_dtype, config) == [expected] * ranks.world_size, config
    for messages in ranks.run(_vendor_gemm_refusals):
        assert "FusedConfig(vendor_gemm=True) writes output in A's dtype" in messages[0]
        assert "must be contiguous" in messages[1]


def _vendor_gemm_refusals():
    ctx = iris.iris(1 << 20)
    device, world = ctx.get_device(), ctx.get_num_ranks()
    a = torch.zeros(8, 4, dtype=torch.bfloat16, device=device)
    b = torch.zeros(4 * world, 16, dtype=torch.bfloat16, device=device)
    config = FusedConfig(vendor_gemm=True)
    messages = refusals([lambda: ctx.ops.all_gather_matmul(torch.zeros(8, 16, device=device), a, b, config=config),
                         lambda: ctx.ops.all_gather_matmul(torch.zeros(8, 16, dtype=a.dtype, device=device),
                                                           torch.zeros(4, 8, dtype=a.dtype, device=device).t(), b,
                                                           config=config)])
    ctx.close()
    return messages


def test_all_gather_matmul_with_slices_pushed_by_programs_matches_float64(ranks):
    """FusedConfig(copy_engine=False): the computing programs store A's pieces into every member (the
    way of sending taken from 1025 rows on, and wherever copies are refused)."""
    for rank, errors in enumerate(ranks.run(run_op, "all_gather_matmul", 40, 70, 24, torch.float32, True,
                                            seeds=[1, 2], config=FusedConfig(copy_engine=False))):
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("copy_engine", [False, True])
def test_all_gather_matmul_with_its_last_round_split_by_member_slice_matches_float64(ranks, copy_engine):
    """FusedConfig(split_k=2): the last round's tiles (on the CPU backend's one program: the last tile) in two
    parts, this rank's own slice and the gathered one, the second adding the first's; called again, the parts'
    flags start over. Pushed by the programs (every piece pushed before a part waits) and sent by copies."""
    if copy_engine:
        skip_where_copies_are_refused(ranks)
    config = FusedConfig(copy_engine=copy_engine, split_k=2)
    # split: here the last tile (one part handed over), on a GPU each tile of the last (only) round
    assert all(handed >= 1 for handed in ranks.run(parts_handed_over, 72, 80, 40, config))
    for rank, errors in enumerate(ranks.run(run_op, "all_gather_matmul", 72, 80, 40, torch.float32, True,
                                            seeds=[3, 4, 5], config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("copy_engine,in_parts", [(False, False), (True, False), (False, True)])
def test_all_gather_matmul_with_descriptors_made_once_per_program_matches_float64(ranks, copy_engine, in_parts):
    """tma_loads=True where K_r is a multiple of BLOCK_K (the interpreter's 32; K 128: 64 at 2 ranks, 32 at 4):
    each program makes its three descriptors once (its own slice, the gathered slots as one matrix, the whole
    B) and each slice is a row offset into them; M 72 leaves a ragged last row block, whose rows past M read
    the next slot's rows. Pushed, sent by copies, and with the last round in parts (the fitted split)."""
    if copy_engine:
        skip_where_copies_are_refused(ranks)
    config = FusedConfig(tma_loads=True, copy_engine=copy_engine)
    assert all(ranks.run(takes_tma, "all_gather_matmul", 72, 80, 128, config))
    run = run_op_with_free_parts if in_parts else run_op
    for rank, result in enumerate(ranks.run(run, "all_gather_matmul", 72, 80, 128, torch.float32, True,
                                            seeds=[4, 5], config=config)):
        handed, errors = result if in_parts else (None, result)
        assert handed is None or handed >= 1, f"rank {rank}: no part handed over"
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("split_k", [2, 3])
def test_all_gather_matmul_last_round_split_at_three_ranks_matches_float64(three_ranks, split_k):
    """At 3 members, 2 parts (own slice and the next; the last) or 3 (one slice each)."""
    config = FusedConfig(copy_engine=False, split_k=split_k)
    for rank, errors in enumerate(three_ranks.run(run_op, "all_gather_matmul", 40, 72, 24, torch.bfloat16, True,
                                                  seeds=[6, 7], config=config)):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"rank {rank}: relative errors {errors}"


def test_the_last_round_is_split_where_its_parts_finish_sooner():
    """last_round(tiles, programs, members, split_k) -> (tiles computed whole, parts of each other tile): fitted, the
    parts of a half-empty last round fill it (a part costing 1 / S of a tile plus SPLIT_COST); set, as set (at most
    one part per member)."""
    from iris.ops._fused import SPLITS, split_last_round
    from iris.ops.all_gather_matmul.kernel import last_round

    assert last_round(448, 128, 2, None) == (384, 2)  # M 1024 N 14336: 64 tiles in the 4th round, 128 halves
    assert last_round(224, 128, 2, None) == (224, 1)  # 96 in the last round: halves would take two
    assert last_round(2048, 128, 2, None) == (2048, 1)  # whole rounds: nothing to fill
    assert last_round(64, 128, 2, None) == (0, 2)  # one round of 64 tiles
    assert last_round(448, 128, 4, None) == (384, 2)  # 4 parts: 256 quarters in two rounds, slower than halves
    assert last_round(40, 128, 4, None) == (0, 3)  # 120 thirds in one round
    assert last_round(448, 128, 1, None) == (448, 1)  # one member: one slice
    assert last_round(5, 1, 2, 2) == (4, 2)  # the interpreter's one program: its last tile, as set
    assert last_round(5, 1, 2, 3) == (4, 2)  # no more parts than slices
    assert last_round(448, 128, 2, 1) == (448, 1)
    # the matmul_all_gather kernel's choices: 2 or 4 K parts
    assert split_last_round(448, 128, SPLITS) == (384, 2)
    assert split_last_round(224, 128, SPLITS) == (224, 1)
    assert split_last_round(160, 128, SPLITS) == (128, 4)  # 32 tiles left: 128 quarters


def _ways_of_sending():
    from iris.ops.all_gather_matmul.kernel import sends_by_copies

    ctx = iris.iris(1 << 20)
    device = ctx.get_device()
    a = {rows: torch.zeros(rows, 16, dtype=torch.bfloat16, device=device) for rows in (40, 1024, 1025)}
    ways = [sends_by_copies(ctx, FusedConfig(), a[40]), sends_by_copies(ctx, FusedConfig(), a[1024]),
            sends_by_copies(ctx, FusedConfig(), a[1025]),
            sends_by_copies(ctx, FusedConfig(), torch.zeros(16, 40, dtype=torch.bfloat16, device=device).t()),
            sends_by_copies(ctx, FusedConfig(copy_engine=False), a[40]),
            sends_by_copies(ctx, FusedConfig(copy_engine=True, block_size_m=64), a[1025])]
    ctx.close()
    return ways


def test_all_gather_matmul_sends_by_copies_up_to_1024_rows_where_the_job_allows(ranks):
    """copy_engine=None (default): by copies at <= 1024 rows of a contiguous A_shard (measured faster
    there on 2 x H100), by the programs beyond, for a non-contiguous A_shard, and where the job refuses
    copies; True and False are kept as set."""
    refused = copy_refusal_in(ranks) is not None
    for ways in ranks.run(_ways_of_sending):
        assert ways == [not refused, not refused, False, False, False, True]


def test_matmul_all_gather_with_row_blocks_sent_by_triggered_copies_matches_float64(ranks):
    """FusedConfig(copy_engine=True): each row block of this rank's product goes to every member by copies its
    tiles trigger (iris.host.triggered), not by the programs' stores."""
    config = FusedConfig(copy_engine=True)
    for rank, errors in enumerate(ranks.run(run_op, "matmul_all_gather", 72, 80, 40, torch.float32, True,
                                            seeds=[3, 4, 5], config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


def _triggered_replayed(calls=3):
    ctx = iris.iris(1 << 22)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    a, b = torch.empty(40, 24, device=device), torch.empty(24, 48, device=device)
    out = ctx.zeros(world * 40, 48)
    wrong = []
    for call in range(calls):  # the same tensors: the first call plans, the next ones replay its plan
        shards = [(torch.full((40, 24), float(r + call)), torch.eye(24, 48) * (call + 1)) for r in range(world)]
        a.copy_(shards[rank][0])
        b.copy_(shards[rank][1])
        ctx.ops.matmul_all_gather(out, a, b, config=FusedConfig(copy_engine=True))
        ctx.barrier()
        if not torch.equal(out.cpu(), torch.cat([x @ y for x, y in shards])):
            wrong.append(call)
    # the path taken: one remembered call whose launch is a round of triggered copies, run once per call
    # (on GPUs the third call replays the second's graph, which holds the round: the host counts two rounds)
    rounds = [launch.plan.rounds for plan in ctx.ops._plans.plans() for launch in plan.launches]
    graphs = ctx.ops._plans._graphs
    ctx.close()
    return wrong, rounds == ([2] if graphs else [3])


def test_matmul_all_gather_by_triggered_copies_replays_with_new_operands(ranks):
    assert ranks.run(_triggered_replayed) == [([], True)] * ranks.world_size


def _triggered_refusals():
    ctx = iris.iris(1 << 20)
    device, world = ctx.get_device(), ctx.get_num_ranks()
    a, b = torch.ones(8, 16, device=device), torch.ones(16, 32, device=device)
    messages = refusals([
        lambda: ctx.ops.gemm_all_scatter(ctx.zeros(8, world * 32), a, b, config=FusedConfig(copy_engine=True)),
        lambda: ctx.ops.matmul_all_gather(ctx.zeros(world * 8, 32), a, b,
                                          config=FusedConfig(copy_engine=True, split_k=2))])
    ctx.close()
    return dict(zip(("scatter", "split"), messages))


def test_triggered_copies_are_refused_where_they_cannot_serve_before_any_launch(ranks):
    for messages in ranks.run(_triggered_refusals):
        assert "gemm_all_scatter: FusedConfig(copy_engine=True)" in messages["scatter"], messages
        assert "split_k=2" in messages["split"], messages
