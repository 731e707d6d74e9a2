"""ctx.ops' five fused ops against a float64 reference built from every rank's shards."""

import gc
import weakref

import pytest
import torch

import iris
from iris.ops import FusedConfig
from iris.testing import RankPool, refusals
from iris.testing.fused_ops import ON_HEAP, OPS, copy_refusal_in, magnitude, reference, shapes

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _shards(seed, rank, a_shape, b_shape, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(*a_shape, generator=g).to(dtype), torch.randn(*b_shape, generator=g).to(dtype)


def _relative_error(op, got, seed, rank, world, a_shape, b_shape, bias=None, in_dtype=torch.bfloat16):
    """``got``'s relative error against the float64 result from every rank's shards of ``seed`` (inf where ``got``
    holds a NaN: a tile never written)."""
    shards = [_shards(seed, r, a_shape, b_shape, in_dtype) for r in range(world)]
    ref, scale = reference(op, shards, bias, rank), magnitude(op, shards, bias, rank)
    got = got.cpu().double()
    return float("inf") if got.isnan().any() else ((got - ref).norm() / scale.norm()).item()


def _run_op(op, m, n, k, out_dtype, with_bias, seeds, config=None, in_dtype=torch.bfloat16):
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    a_shape, b_shape, out_shape = shapes(op, m, n, k, world)
    errors = []
    for seed in seeds:  # the same problem again: the kept workspace, flags counted further
        a, b = _shards(seed, rank, a_shape, b_shape, in_dtype)
        bias = torch.randn(b_shape[1], generator=torch.Generator().manual_seed(seed)) if with_bias else None
        out = (ctx.full if op in ON_HEAP else torch.full)(out_shape, float("nan"), dtype=out_dtype, device=device)
        getattr(ctx.ops, op)(out, a.to(device), b.to(device), bias=None if bias is None else bias.to(device),
                             config=config)
        ctx.barrier()
        errors.append(_relative_error(op, out, seed, rank, world, a_shape, b_shape, bias, in_dtype))
    ctx.close()
    return errors


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape,out_dtype", [((40, 70, 24), torch.float32), ((64, 32, 50), torch.bfloat16)])
def test_fused_op_matches_float64(ranks, op, shape, out_dtype):
    for rank, errors in enumerate(ranks.run(_run_op, op, *shape, out_dtype, out_dtype == torch.float32,
                                            seeds=[1, 2])):
        assert max(errors) <= TOLERANCE[out_dtype], f"{op}, rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("op", OPS)
def test_fused_op_takes_float32_operands(ranks, op):
    """float32 A and B (the original's tests use them): TF32 on GPUs, so the bfloat16 tolerance."""
    for rank, errors in enumerate(ranks.run(_run_op, op, 40, 70, 24, torch.float32, True, seeds=[3],
                                            in_dtype=torch.float32)):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"{op}, rank {rank}: relative errors {errors}"


def _skip_where_copies_are_refused(pool):
    """copy_engine needs one GPU per rank: a pool with more ranks than GPUs is refused (the op's own check)."""
    refusal = copy_refusal_in(pool)
    if refusal:
        pytest.skip(refusal)


def test_all_gather_matmul_with_slices_sent_by_copies_matches_float64(ranks):
    """FusedConfig(copy_engine=True): A's slices travel by whole copies (the copy engine on a GPU, a copy
    between the mapped heaps here) after an entry barrier, with an arrival flag each, over calls that
    reuse the workspace (the flags are cleared after each call)."""
    _skip_where_copies_are_refused(ranks)
    config = FusedConfig(copy_engine=True)
    for shape, out_dtype in (((40, 70, 24), torch.float32), ((64, 32, 50), torch.bfloat16)):
        for rank, errors in enumerate(ranks.run(_run_op, "all_gather_matmul", *shape, out_dtype,
                                                out_dtype == torch.float32, seeds=[1, 2, 3], config=config)):
            assert max(errors) <= TOLERANCE[out_dtype], f"rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("config", [FusedConfig(copy_engine=True), FusedConfig(vendor_gemm=True)],
                         ids=["kernel", "vendor_gemm"])
def test_all_gather_matmul_by_copies_at_three_ranks_matches_float64(three_ranks, config):
    """By copies at 3 ranks (each member's slice from the two others): Iris's kernel and the vendor's GEMM."""
    _skip_where_copies_are_refused(three_ranks)
    for rank, errors in enumerate(three_ranks.run(_run_op, "all_gather_matmul", 40, 72, 24, torch.bfloat16, True,
                                                  seeds=[6, 7], config=config)):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"rank {rank}: relative errors {errors}"


def test_all_gather_matmul_by_the_vendor_gemm_matches_float64(ranks):
    """FusedConfig(vendor_gemm=True): A's slices travel by whole copies with an arrival flag each, torch's
    GEMM multiplies this rank's slice (with the bias) and adds each member's product once its flag is seen;
    over calls that reuse the workspace (the flags cleared after each), into an output of A's dtype."""
    _skip_where_copies_are_refused(ranks)
    config = FusedConfig(vendor_gemm=True)
    assert all(ranks.run(_takes_vendor_gemm, 64, 32, 50, torch.bfloat16, config))
    for with_bias in (True, False):
        for rank, errors in enumerate(ranks.run(_run_op, "all_gather_matmul", 64, 32, 50, torch.bfloat16, with_bias,
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
    for rank, errors in enumerate(ranks.run(_run_op, "all_gather_matmul", 40, 70, 24, torch.float32, True,
                                            seeds=[1, 2], config=FusedConfig(copy_engine=False))):
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


def _parts_handed_over(m, n, k, config, op="all_gather_matmul"):
    """How many tile parts a call of ``op`` hands over (its workspace's part flags; none without a split)."""
    ctx = iris.iris(1 << 20)
    world, device = ctx.get_num_ranks(), ctx.get_device()
    a_shape, b_shape, out_shape = shapes(op, m, n, k, world)
    a, b = (torch.zeros(*shape, dtype=torch.bfloat16, device=device) for shape in (a_shape, b_shape))
    _, spec = ctx.ops.workspace_layout(op, torch.zeros(out_shape, device=device), a, b, config)
    ctx.close()
    return spec["ready"].numel if "ready" in spec else 0


@pytest.mark.parametrize("copy_engine", [False, True])
def test_all_gather_matmul_with_its_last_round_split_by_member_slice_matches_float64(ranks, copy_engine):
    """FusedConfig(split_k=2): the last round's tiles (on the CPU backend's one program: the last tile) in two
    parts, this rank's own slice and the gathered one, the second adding the first's; called again, the parts'
    flags start over. Pushed by the programs (every piece pushed before a part waits) and sent by copies."""
    if copy_engine:
        _skip_where_copies_are_refused(ranks)
    config = FusedConfig(copy_engine=copy_engine, split_k=2)
    # split: here the last tile (one part handed over), on a GPU each tile of the last (only) round
    assert all(handed >= 1 for handed in ranks.run(_parts_handed_over, 72, 80, 40, config))
    for rank, errors in enumerate(ranks.run(_run_op, "all_gather_matmul", 72, 80, 40, torch.float32, True,
                                            seeds=[3, 4, 5], config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("copy_engine,in_parts", [(False, False), (True, False), (False, True)])
def test_all_gather_matmul_with_descriptors_made_once_per_program_matches_float64(ranks, copy_engine, in_parts):
    """tma_loads=True where K_r is a multiple of BLOCK_K (the interpreter's 32; K 128: 64 at 2 ranks, 32 at 4):
    each program makes its three descriptors once (its own slice, the gathered slots as one matrix, the whole
    B) and each slice is a row offset into them; M 72 leaves a ragged last row block, whose rows past M read
    the next slot's rows. Pushed, sent by copies, and with the last round in parts (the fitted split)."""
    if copy_engine:
        _skip_where_copies_are_refused(ranks)
    config = FusedConfig(tma_loads=True, copy_engine=copy_engine)
    assert all(ranks.run(_takes_tma, "all_gather_matmul", 72, 80, 128, config))
    run = _run_op_with_free_parts if in_parts else _run_op
    for rank, result in enumerate(ranks.run(run, "all_gather_matmul", 72, 80, 128, torch.float32, True,
                                            seeds=[4, 5], config=config)):
        handed, errors = result if in_parts else (None, result)
        assert handed is None or handed >= 1, f"rank {rank}: no part handed over"
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("split_k", [2, 3])
def test_all_gather_matmul_last_round_split_at_three_ranks_matches_float64(three_ranks, split_k):
    """At 3 members, 2 parts (own slice and the next; the last) or 3 (one slice each)."""
    config = FusedConfig(copy_engine=False, split_k=split_k)
    for rank, errors in enumerate(three_ranks.run(_run_op, "all_gather_matmul", 40, 72, 24, torch.bfloat16, True,
                                                  seeds=[6, 7], config=config)):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"rank {rank}: relative errors {errors}"


def test_the_last_round_is_split_where_its_parts_finish_sooner():
    """last_round(tiles, programs, members, split_k) -> (tiles computed whole, parts of each other tile): fitted, the
    parts of a half-empty last round fill it (a part costing 1 / S of a tile plus SPLIT_COST); set, as set (at most
    one part per member)."""
    from iris.ops._fused import SPLITS, split_last_round
    from iris.ops.gather_matmul import last_round

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
    # matmul_gather's choices: 2 or 4 K parts
    assert split_last_round(448, 128, SPLITS) == (384, 2)
    assert split_last_round(224, 128, SPLITS) == (224, 1)
    assert split_last_round(160, 128, SPLITS) == (128, 4)  # 32 tiles left: 128 quarters


def _ways_of_sending():
    from iris.ops.gather_matmul import sends_by_copies

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


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter"])
@pytest.mark.parametrize("comm_programs", [1, 3])
def test_reduce_ops_with_communication_programs_match_float64(ranks, op, comm_programs):
    """Workgroup specialization: programs that only exchange and sum the tiles the others stage."""
    config = FusedConfig(comm_programs=comm_programs)
    for rank, errors in enumerate(ranks.run(_run_op, op, 72, 80, 40, torch.float32, True, seeds=[3, 4, 5],
                                            config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"{op}, rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("op", ["matmul_all_gather", "gemm_all_scatter"])
@pytest.mark.parametrize("split_k", [2, 3])
def test_gather_ops_with_k_split_match_float64(ranks, op, split_k):
    """FusedConfig(split_k=S): S programs per tile, each over a part of K (K 100 in steps of 32: with 3
    parts the last one is empty), the last adding the others'; called again, the parts' flags start over."""
    config = FusedConfig(split_k=split_k)
    for rank, errors in enumerate(ranks.run(_run_op, op, 72, 80, 100, torch.float32, True, seeds=[3, 4, 5],
                                            config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"{op}, rank {rank}: relative errors {errors}"
    for rank, errors in enumerate(ranks.run(_run_op, op, 40, 70, 100, torch.bfloat16, False, seeds=[6],
                                            config=config)):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"{op}, rank {rank}: relative errors {errors}"


def _run_op_with_free_parts(op, m, n, k, out_dtype, with_bias, seeds, config=None):
    """(parts handed over, _run_op's errors) where the fitting takes K parts for free (SPLIT_COST below zero, from
    any row count): on the CPU backend's one program only the last tile is split, after the others ran whole."""
    from iris.ops import _fused

    saved = _fused.SPLIT_COST, _fused.SPLIT_MIN_ROWS
    _fused.SPLIT_COST, _fused.SPLIT_MIN_ROWS = -0.2, 0
    try:
        return _parts_handed_over(m, n, k, config, op), _run_op(op, m, n, k, out_dtype, with_bias, seeds, config)
    finally:
        _fused.SPLIT_COST, _fused.SPLIT_MIN_ROWS = saved


@pytest.mark.parametrize("op", ["matmul_all_gather", "gemm_all_scatter", "all_gather_matmul"])
def test_fused_ops_with_a_fitted_last_round_split_match_float64(ranks, op):
    """The fitted split of the last round's tiles (whole tiles first, then the parts; K 100: matmul_gather's
    4 parts of 32, 32, 32 and 4), over calls that reuse the workspace."""
    for rank, (handed, errors) in enumerate(ranks.run(_run_op_with_free_parts, op, 72, 80, 100, torch.float32, True,
                                                      seeds=[3, 4])):
        assert handed >= 1, f"{op}, rank {rank}: no part handed over"
        assert max(errors) <= TOLERANCE[torch.float32], f"{op}, rank {rank}: relative errors {errors}"


def test_a_k_split_is_fitted_where_the_default_tile_leaves_most_programs_idle():
    """fitted_launch() with the K splits matmul_gather takes: from 256 output rows, the default tile cut in 2 or 4
    where its parts fill the programs in fewer waves (at their measured cost) than the half or small tile; set by
    hand, as set."""
    from iris.ops._fused import SPLITS, fitted_launch

    default = FusedConfig()
    assert fitted_launch(default, 256, 8192, 132, torch.bfloat16)["BLOCK_N"] == 128  # no splits: the half tile
    assert "SPLIT" not in fitted_launch(default, 256, 8192, 132, torch.bfloat16)

    def fitted(rows, cols, programs=132, config=default):
        launch = fitted_launch(config, rows, cols, programs, torch.bfloat16, SPLITS)
        return launch["BLOCK_M"], launch["BLOCK_N"], launch["SPLIT"]

    assert fitted(256, 8192) == (128, 256, 2)  # 64 tiles: 128 halves, one wave
    # fewer than SPLIT_MIN_ROWS rows: the small tile's parts compete instead of the default tile's
    assert fitted(64, 8192) == (64, 128, 2)  # 64 small tiles: 128 halves, one wave
    assert fitted(128, 4096) == (64, 128, 2)
    assert fitted(128, 8192) == (64, 128, 1)  # 128 small tiles: one wave already
    assert fitted(128, 7168) == (64, 128, 1)  # 112 small tiles; 224 halves would take two waves
    assert fitted(128, 14336) == (128, 128, 1)  # the half tile, whole
    assert fitted(64, 8192, config=FusedConfig(split_k=1)) == (64, 128, 1)
    assert fitted(256, 14336) == (128, 256, 1)  # 112 tiles: one wave already
    assert fitted(512, 8192) == (128, 256, 1)
    assert fitted(4096, 8192) == (128, 256, 1)
    assert fitted(256, 8192, config=FusedConfig(split_k=3)) == (128, 128, 3)  # the split as set, the tile fitted
    assert fitted(256, 8192, config=FusedConfig(split_k=1)) == (128, 128, 1)


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter", "matmul_all_gather",
                                "gemm_all_scatter", "all_gather_matmul"])
def test_fused_op_with_tma_loads_matches_float64(ranks, op):
    """FusedConfig(tma_loads=True): operand tiles through tensor descriptors, ragged edges zero-filled."""
    config = FusedConfig(tma_loads=True)
    assert all(ranks.run(_takes_tma, op, 72, 80, 64, config))  # 16-byte rows: the descriptors are used
    for rank, errors in enumerate(ranks.run(_run_op, op, 72, 80, 64, torch.float32, True, seeds=[8, 9],
                                            config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"{op}, rank {rank}: relative errors {errors}"


def test_tma_loads_by_default_where_a_has_2048_rows_or_more():
    """FusedConfig() (tma_loads None) takes the descriptors where this rank's A has at least
    TMA_AUTO_ROWS rows, where they were measured faster on 2 x H200; True or False is obeyed."""
    from iris.ops._fused import TMA_AUTO_ROWS, tma_loads

    ctx = iris.iris(1 << 20)
    try:
        b = torch.zeros(64, 64, dtype=torch.bfloat16, device=ctx.get_device())
        tall, short = (torch.zeros(rows, 64, dtype=torch.bfloat16, device=ctx.get_device())
                       for rows in (TMA_AUTO_ROWS, TMA_AUTO_ROWS - 1))
        assert TMA_AUTO_ROWS == 2048 and FusedConfig().tma_loads is None
        assert tma_loads(ctx, FusedConfig(), tall, b) and not tma_loads(ctx, FusedConfig(), short, b)
        assert tma_loads(ctx, FusedConfig(tma_loads=True), short, b)
        assert not tma_loads(ctx, FusedConfig(tma_loads=False), tall, b)
    finally:
        ctx.close()


def test_the_default_tile_gives_way_to_a_smaller_one_where_it_leaves_most_programs_idle():
    """fitted_launch(): with the tile fields at their defaults, the tile whose waves (at its measured cost per
    tile) finish soonest: a half-width or a small tile at decode-like M; a tile set by hand is used as set."""
    from iris.ops._fused import HALF_TILE, SMALL_TILE, fitted_launch

    def launch(tile):
        return dict(BLOCK_M=tile["block_size_m"], BLOCK_N=tile["block_size_n"], BLOCK_K=64, GROUP_M=8,
                    num_warps=tile["num_warps"], num_stages=tile["num_stages"])

    default = FusedConfig()
    big = dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    half = launch(dict(dict(block_size_m=128, block_size_n=256, num_warps=8, num_stages=3), **HALF_TILE))
    small = launch(SMALL_TILE)
    assert half["BLOCK_M"] * half["BLOCK_N"] * 2 == 128 * 256 and half != small
    assert fitted_launch(default, 128, 8192, 132, torch.bfloat16) == small  # 32 tiles on 132 programs
    assert fitted_launch(default, 512, 8192, 132, torch.bfloat16) == big  # 128 tiles: one wave already
    assert fitted_launch(default, 128, 14336, 132, torch.bfloat16) == half  # 56 tiles; 112 half ones, one wave
    assert fitted_launch(default, 256, 8192, 132, torch.bfloat16) == half  # 64 tiles; small ones take 2 waves
    assert fitted_launch(default, 256, 14336, 132, torch.bfloat16) == big  # 112 tiles: one wave already
    assert fitted_launch(default, 128, 8192, 66, torch.bfloat16) == half  # half the SMs (2 ranks on a GPU)
    assert fitted_launch(default, 64, 4096, 66, torch.bfloat16) == small
    hand = FusedConfig(block_size_n=128)
    assert fitted_launch(hand, 128, 8192, 132, torch.bfloat16)["BLOCK_N"] == 128  # as set, not fitted
    assert fitted_launch(hand, 128, 8192, 132, torch.bfloat16)["BLOCK_M"] == 128
    assert fitted_launch(default, 4096, 8192, 132, torch.float32)["BLOCK_K"] == 32  # float32: half the depth


def _takes_tma(op, m, n, k, config):
    from iris.ops._fused import tma_loads

    ctx = iris.iris(1 << 20)
    a_shape, b_shape, _ = shapes(op, m, n, k, ctx.get_num_ranks())
    a, b = (torch.zeros(shape, dtype=torch.bfloat16, device=ctx.get_device()) for shape in (a_shape, b_shape))
    taken = tma_loads(ctx, config, a, b) and not tma_loads(ctx, config, a.t().contiguous().t(), b)
    ctx.close()
    return taken


def _replayed_calls(op, config=None):
    """The same call three times on the same tensors with new data in them, then with a config changed in
    place (remembered by value), then with tracing on: the errors and how many calls ctx.ops remembers."""
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    a_shape, b_shape, out_shape = shapes(op, 40, 70, 24, world)
    a, b = torch.empty(a_shape, dtype=torch.bfloat16, device=device), torch.empty(b_shape, dtype=torch.bfloat16,
                                                                                  device=device)
    out = (ctx.empty if op in ON_HEAP else torch.empty)(out_shape, dtype=torch.float32, device=device)
    config, errors, plans = FusedConfig() if config is None else config, [], []
    for seed, change in enumerate([None, None, None, "num_stages", "tracing"]):
        if change == "num_stages":
            config.num_stages = 2
        if change == "tracing":
            ctx.tracing.enable(max_events=1000)
        shard_a, shard_b = _shards(seed, rank, a_shape, b_shape)
        a.copy_(shard_a)
        b.copy_(shard_b)
        out.fill_(float("nan"))
        ctx.barrier()
        workspace = getattr(ctx.ops, op)(out, a, b, config=config)
        ctx.barrier()
        errors.append(_relative_error(op, out, seed, rank, world, a_shape, b_shape))
        plans.append((len(ctx.ops._plans), type(workspace).__name__))
    ctx.close()
    return errors, plans


@pytest.mark.parametrize("op", OPS)
def test_a_repeated_fused_call_replays_its_launches_on_new_data(ranks, op):
    """ctx.ops remembers a call's launches: the same tensors again replay them (new data, right results);
    a config changed in place or the tracing switch makes a new plan; every call returns its workspace."""
    for errors, plans in ranks.run(_replayed_calls, op):
        assert max(errors) < TOLERANCE[torch.float32] * 10, errors
        assert plans == [(1, "Workspace"), (1, "Workspace"), (1, "Workspace"), (2, "Workspace"), (3, "Workspace")]


def test_a_repeated_pipelined_call_replays_its_launches_on_new_data(ranks):
    """The pipeline's launches (a barrier, each chunk's GEMM and the fork of its all_reduce, the join) replayed
    as a plan, on a GPU from a captured graph with the chunks' all_reduce captured inside it."""
    for errors, plans in ranks.run(_replayed_calls, "matmul_all_reduce", FusedConfig(pipeline_chunks=2)):
        assert max(errors) < TOLERANCE[torch.float32] * 10, errors
        assert plans == [(1, "Workspace"), (1, "Workspace"), (1, "Workspace"), (2, "Workspace"), (3, "Workspace")]


def _operands_kept_alive(op, config):
    """Whether ctx.ops keeps any of a remembered call's operands alive once the caller has dropped them (a
    call and its replay, then the operands dropped), and whether a call on new operands then is right."""
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    a_shape, b_shape, out_shape = shapes(op, 40, 48, 24, world)
    errors, refs = [], []
    for seed in (1, 2):
        a, b = (shard.to(device) for shard in _shards(seed, rank, a_shape, b_shape))
        bias = torch.randn(b_shape[1], generator=torch.Generator().manual_seed(seed))
        out = torch.empty(out_shape, dtype=torch.bfloat16, device=device)
        for _ in range(2):  # remembered, then replayed
            getattr(ctx.ops, op)(out, a, b, bias=bias.to(device), config=config)
        ctx.barrier()
        errors.append(_relative_error(op, out, seed, rank, world, a_shape, b_shape, bias))
        refs += [weakref.ref(t) for t in (a, b, out)]
        del a, b, out
    gc.collect()
    alive = [ref() is not None for ref in refs]
    ctx.close()
    return alive, errors


@pytest.mark.parametrize("op,config", [("all_gather_matmul", FusedConfig(vendor_gemm=True)),
                                       ("matmul_all_reduce", FusedConfig(pipeline_chunks=2)),
                                       ("matmul_all_reduce", FusedConfig(vendor_gemm=True))],
                         ids=["all_gather_matmul-vendor", "matmul_all_reduce-pipeline", "matmul_all_reduce-vendor"])
def test_a_remembered_call_keeps_none_of_its_operands_alive(ranks, op, config):
    """The launches that torch runs (the vendor's GEMM, the pipeline's chunks) hold the caller's tensors weakly:
    a plan whose tensors died is dropped, not replayed, and does not keep their memory (one plan per call of
    new tensors would otherwise hold every one of them)."""
    if op == "all_gather_matmul":
        _skip_where_copies_are_refused(ranks)
    for alive, errors in ranks.run(_operands_kept_alive, op, config):
        assert not any(alive), alive
        assert max(errors) <= TOLERANCE[torch.bfloat16], errors


@pytest.fixture(scope="module")
def three_ranks():
    """A world that is neither 2 nor a power of two (tiles' owners wrap unevenly)."""
    pool = RankPool(3)
    yield pool
    pool.close()


@pytest.mark.parametrize("reduce_at_owner", [True, False, None])
def test_matmul_all_reduce_with_and_without_owner_reduce_matches_float64(ranks, reduce_at_owner):
    """Owner-reduce (each tile summed by one owner, from which every other member reads the sum) and
    push-to-all, forced either way and as picked by world size, over calls that reuse the workspace."""
    config = FusedConfig(reduce_at_owner=reduce_at_owner, copy_engine=False)
    for rank, errors in enumerate(ranks.run(_run_op, "matmul_all_reduce", 72, 80, 40, torch.float32, True,
                                            seeds=[3, 4, 5], config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


def _pipelined(m, n, k, chunks, seeds, variant=None, vendor_gemm=None, out_dtype=torch.float32, comm_sms=None):
    """matmul_all_reduce with FusedConfig(pipeline_chunks=chunks) into a plain output and into a heap one
    (either way the chunks are summed in the workspace and copied out): per call, the relative error of each
    against float64 and whether the two outputs hold the same bits."""
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    a_shape, b_shape, out_shape = shapes("matmul_all_reduce", m, n, k, world)
    config = FusedConfig(pipeline_chunks=chunks, all_reduce_variant=variant, vendor_gemm=vendor_gemm,
                         pipeline_comm_sms=comm_sms)
    results = []
    for seed in seeds:  # the same problem again: the kept workspace
        a, b = (t.to(device) for t in _shards(seed, rank, a_shape, b_shape, torch.bfloat16))
        bias = torch.randn(b_shape[1], generator=torch.Generator().manual_seed(seed)).to(device)
        plain = torch.full(out_shape, float("nan"), dtype=out_dtype, device=device)
        on_heap = ctx.full(out_shape, float("nan"), dtype=out_dtype)
        ctx.ops.matmul_all_reduce(plain, a, b, bias=bias, config=config)
        ctx.ops.matmul_all_reduce(on_heap, a, b, bias=bias, config=config)
        ctx.barrier()
        errors = [_relative_error("matmul_all_reduce", got, seed, rank, world, a_shape, b_shape, bias.cpu())
                  for got in (plain, on_heap)]
        results.append((errors, torch.equal(plain.cpu(), on_heap.cpu())))
    ctx.close()
    return results


@pytest.mark.parametrize("chunks,comm_sms", [(1, None), (5, None), (2, 40)])
def test_matmul_all_reduce_pipelined_by_row_chunks_matches_float64(ranks, chunks, comm_sms):
    """FusedConfig(pipeline_chunks=C): Iris's GEMM by C row chunks (72 rows: 5 do not divide them), each
    chunk summed over the ranks by iris.ccl.all_reduce behind it, into a plain and a heap output, over calls
    that reuse the workspace; every rank gets the same bits either way. pipeline_comm_sms: the SMs the GEMM
    leaves to the sums (on a GPU; Triton's interpreter runs one program at a time)."""
    for rank, results in enumerate(ranks.run(_pipelined, 72, 80, 40, chunks, seeds=[3, 4], comm_sms=comm_sms)):
        for errors, same in results:
            assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"
            assert same, f"rank {rank}: the plain and the heap output differ"


@pytest.mark.parametrize("chunks", [None, 3])
def test_matmul_all_reduce_pipelined_with_the_vendor_gemm_matches_float64(ranks, chunks):
    """FusedConfig(vendor_gemm=True): the pipeline of row chunks (4 unless pipeline_chunks says), torch's GEMM
    computing each chunk's partial, into bfloat16 outputs; every rank gets the same bits either way."""
    for rank, results in enumerate(ranks.run(_pipelined, 72, 80, 40, chunks, seeds=[3, 4], vendor_gemm=True,
                                             out_dtype=torch.bfloat16)):
        for errors, same in results:
            assert max(errors) <= TOLERANCE[torch.bfloat16], f"rank {rank}: relative errors {errors}"
            assert same, f"rank {rank}: the plain and the heap output differ"


def _vendor_pipeline_refusals():
    ctx = iris.iris(1 << 20)
    device = ctx.get_device()
    a = torch.zeros(8, 4, dtype=torch.bfloat16, device=device)
    b = torch.zeros(4, 16, dtype=torch.bfloat16, device=device)
    out = torch.zeros(8, 16, dtype=torch.bfloat16, device=device)
    messages = refusals([lambda: ctx.ops.matmul_all_reduce(out.float(), a, b, config=FusedConfig(vendor_gemm=True)),
                         lambda: ctx.ops.matmul_all_reduce(out, a, b, config=FusedConfig(vendor_gemm=True,
                                                                                          pipeline_chunks=0)),
                         lambda: ctx.ops.matmul_all_reduce(out, a, b, config=FusedConfig(vendor_gemm=True,
                                                                                          reduce_at_owner=True))])
    ctx.close()
    return messages


def test_matmul_all_reduce_by_the_vendor_gemm_refuses_what_the_pipeline_cannot_do_before_any_launch(ranks):
    for messages in ranks.run(_vendor_pipeline_refusals):
        assert "FusedConfig(vendor_gemm=True) writes output in A's dtype" in messages[0]
        assert all("vendor_gemm=True) runs matmul_all_reduce as the pipeline of row chunks" in message
                   for message in messages[1:]), messages


@pytest.mark.parametrize("variant", ["hierarchical", "ll"])
def test_matmul_all_reduce_pipelined_sums_its_chunks_by_the_variant_asked_for(ranks, variant):
    """FusedConfig.all_reduce_variant (the original's choice of the all-reduce inside matmul_all_reduce) picks the
    chunks' all_reduce: hierarchical (on one node a reduce_scatter, then an all_gather) or ll (small chunks)."""
    for rank, results in enumerate(ranks.run(_pipelined, 40, 48, 24, 2, seeds=[5], variant=variant)):
        for errors, same in results:
            assert max(errors) <= TOLERANCE[torch.float32] and same, f"rank {rank}: {errors}, {same}"


def _pipelined_refusal(variant):
    ctx = iris.iris(1 << 22)
    a_shape, b_shape, out_shape = shapes("matmul_all_reduce", 40, 48, 24, ctx.get_num_ranks())
    a, b = (torch.ones(shape, dtype=torch.bfloat16, device=ctx.get_device()) for shape in (a_shape, b_shape))
    out = torch.zeros(out_shape, dtype=torch.float32, device=ctx.get_device())
    before = out.clone()
    try:
        ctx.ops.matmul_all_reduce(out, a, b, config=FusedConfig(pipeline_chunks=2, all_reduce_variant=variant))
    except ValueError as error:
        return str(error), torch.equal(out, before)
    finally:
        ctx.close()
    return None, None


def test_matmul_all_reduce_pipelined_refuses_a_variant_that_cannot_sum_in_place_before_any_launch(ranks):
    for message, untouched in ranks.run(_pipelined_refusal, "one_shot"):
        assert message is not None and "one_shot cannot run in place" in message and untouched


def test_matmul_all_reduce_pipelined_at_three_ranks_matches_float64(three_ranks):
    for rank, results in enumerate(three_ranks.run(_pipelined, 40, 72, 24, 3, seeds=[6])):
        for errors, same in results:
            assert max(errors) <= TOLERANCE[torch.float32] and same, f"rank {rank}: {errors}, {same}"


def test_the_pipeline_by_default_from_4_ranks_and_8192_rows():
    """pipeline_chunks None: 4 chunks where measured faster (4 x H100: M 16384, 4-22%), else the fused kernel."""
    from iris.ops.pipelined import default_chunks

    assert [default_chunks(world, rows) for world, rows in ((2, 16384), (3, 16384), (4, 4096), (4, 8191))] == [0] * 4
    assert [default_chunks(world, rows) for world, rows in ((4, 8192), (4, 16384), (8, 65536))] == [4] * 3


def test_the_fused_kernel_is_kept_where_a_mode_of_it_or_a_variant_without_any_chunk_in_place_is_given():
    """Code written for the original may pass any all_reduce_variant (no effect on the fused kernel): the ones that
    cannot sum every chunk in place keep pipeline_chunks=None on the fused kernel, as its own modes do."""
    from iris.ops.pipelined import fused_kernel_asked_for

    kept = [FusedConfig(reduce_at_owner=True), FusedConfig(reduce_at_owner=False), FusedConfig(comm_programs=1),
            FusedConfig(copy_engine=True), FusedConfig(copy_engine=False)]
    kept += [FusedConfig(all_reduce_variant=v) for v in ("one_shot", "atomic", "spinlock", "ring", "push", "ll")]
    pipelined = [FusedConfig(), FusedConfig(all_reduce_variant="two_shot"),
                 FusedConfig(all_reduce_variant="hierarchical"), FusedConfig(block_size_n=128)]
    assert all(map(fused_kernel_asked_for, kept)) and not any(map(fused_kernel_asked_for, pipelined))


def _pipelines_chosen():
    from iris.ops._fused import copy_refusal
    from iris.ops.pipelined import chunks

    ctx = iris.iris(1 << 22)
    device, world = ctx.get_device(), ctx.get_num_ranks()
    tall, short = (torch.zeros(rows, 8, dtype=torch.bfloat16, device=device) for rows in (8192, 64))
    chosen = [chunks(ctx, FusedConfig(), tall), chunks(ctx, FusedConfig(), short),
              chunks(ctx, FusedConfig(pipeline_chunks=0), tall), chunks(ctx, FusedConfig(pipeline_chunks=3), short),
              chunks(ctx, FusedConfig(vendor_gemm=True), short)]
    chosen += [chunks(ctx, config, tall) for config in (  # the fused kernel's own modes, asked for
        FusedConfig(reduce_at_owner=True), FusedConfig(reduce_at_owner=False), FusedConfig(comm_programs=1),
        FusedConfig(copy_engine=True))]
    # the original's all_reduce_variant: one that sums a chunk of any size in place keeps the pipeline; another
    # (no effect on the fused kernel, as in code written for the original) keeps the fused kernel
    chosen += [chunks(ctx, FusedConfig(all_reduce_variant=variant), tall)
               for variant in ("two_shot", "hierarchical", "one_shot", "atomic", "ll", "push")]
    pipelines = not ctx.team.backend.interpreted and copy_refusal(ctx) is None and world >= 4
    ctx.close()
    return chosen, pipelines


def test_matmul_all_reduce_pipelines_by_default_only_where_measured_faster(ranks):
    """None: 4 chunks on GPUs, one per rank and at least 4 of them, from 8192 rows; never on the CPU backend,
    where a mode of the fused kernel is asked for, or an all_reduce variant that cannot sum any chunk in place;
    0 asks for the fused kernel, C >= 1 for C chunks; vendor_gemm=True: 4 chunks wherever it runs."""
    for chosen, pipelines in ranks.run(_pipelines_chosen):
        by_default = 4 if pipelines else 0
        assert chosen == [by_default, 0, 0, 3, 4, 0, 0, 0, 0, by_default, by_default, 0, 0, 0, 0]


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter"])
def test_reduce_ops_at_three_ranks_match_float64(three_ranks, op):
    for rank, errors in enumerate(three_ranks.run(_run_op, op, 40, 72, 24, torch.bfloat16, True, seeds=[6, 7])):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"{op}, rank {rank}: relative errors {errors}"


def _scatter_by_copies(m, n, k, seeds):
    """matmul_reduce_scatter with FusedConfig(copy_engine=True), into an (M, N / W) output and into this rank's
    columns of an (M, N) one (the original's layout): the errors of each call, and the chunks' flags all clear
    after the last call (the finish clears them for the next call)."""
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    config = FusedConfig(copy_engine=True)
    a_shape, b_shape, out_shape = shapes("matmul_reduce_scatter", m, n, k, world)
    errors = []
    for seed in seeds:
        a, b = (t.to(device) for t in _shards(seed, rank, a_shape, b_shape))
        bias = torch.randn(b_shape[1], generator=torch.Generator().manual_seed(seed))
        for full in (False, True):
            width = b_shape[1] // world
            out = torch.full((m, b_shape[1]) if full else out_shape, float("nan"), device=device)
            workspace = ctx.ops.matmul_reduce_scatter(out, a, b, bias=bias.to(device), config=config)
            ctx.barrier()
            got = out[:, rank * width:(rank + 1) * width] if full else out
            errors.append(_relative_error("matmul_reduce_scatter", got, seed, rank, world, a_shape, b_shape, bias))
            if full:  # the other columns are left as they were
                errors.append(0.0 if out[:, :rank * width].isnan().all() and out[:, (rank + 1) * width:].isnan().all()
                              else float("inf"))
    clear = not workspace.flags.any().item()
    ctx.close()
    return errors, clear


@pytest.mark.parametrize("shape", [(40, 70, 24), (200, 64, 48)])
def test_matmul_reduce_scatter_with_partials_sent_by_copies_matches_float64(ranks, shape):
    """FusedConfig(copy_engine=True): one launch computes the partials of the other members' columns into a
    local stage, copies (the copy engine on a GPU) send them to their owners by row chunks, each chunk's flag
    after it, and a second launch computes this rank's own columns and adds the members' partials chunk by
    chunk as their flags arrive (M 200: 7 row blocks of the interpreter's 32, 7 chunks), over calls that reuse
    the workspace."""
    _skip_where_copies_are_refused(ranks)
    for rank, (errors, clear) in enumerate(ranks.run(_scatter_by_copies, *shape, seeds=[3, 4])):
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"
        assert clear, f"rank {rank}: flags left set"


def test_matmul_reduce_scatter_by_copies_at_three_ranks_matches_float64(three_ranks):
    _skip_where_copies_are_refused(three_ranks)
    for rank, (errors, clear) in enumerate(three_ranks.run(_scatter_by_copies, 72, 48, 40, seeds=[6])):
        assert max(errors) <= TOLERANCE[torch.float32] and clear, f"rank {rank}: relative errors {errors}"


def _all_reduce_by_copies(m, n, k, seeds):
    """matmul_all_reduce with FusedConfig(copy_engine=True): _run_op's errors, and the flags all clear after."""
    errors = _run_op("matmul_all_reduce", m, n, k, torch.float32, True, seeds, config=FusedConfig(copy_engine=True))
    ctx = iris.iris(1 << 20)  # the kept workspace is the context's: look again on a new one, called once
    device, world = ctx.get_device(), ctx.get_num_ranks()
    a = torch.ones(m, k // world, device=device, dtype=torch.bfloat16)
    b = torch.ones(k // world, n, device=device, dtype=torch.bfloat16)
    out = torch.empty(m, n, device=device)
    workspace = ctx.ops.matmul_all_reduce(out, a, b, config=FusedConfig(copy_engine=True))
    ctx.barrier()
    right = bool((out == k // world * world).all())
    clear = not workspace.flags.any().item()
    ctx.close()
    return errors, right, clear


@pytest.mark.parametrize("shape", [(40, 72, 24), (200, 64, 48)])
def test_matmul_all_reduce_with_partials_sent_by_copies_matches_float64(ranks, shape):
    """FusedConfig(copy_engine=True) for matmul_all_reduce: member r sums columns [r N / W, (r + 1) N / W) from
    partials sent by copies (as matmul_reduce_scatter's), stores each sum on every other member and copies the
    others' sums into its output; over calls that reuse the workspace, the flags cleared after each."""
    _skip_where_copies_are_refused(ranks)
    for rank, (errors, right, clear) in enumerate(ranks.run(_all_reduce_by_copies, *shape, seeds=[3, 4])):
        assert max(errors) <= TOLERANCE[torch.float32] and right and clear, (rank, errors, right, clear)


def test_matmul_all_reduce_by_copies_at_three_ranks_matches_float64(three_ranks):
    _skip_where_copies_are_refused(three_ranks)
    for rank, (errors, right, clear) in enumerate(three_ranks.run(_all_reduce_by_copies, 72, 48, 48, seeds=[6])):
        assert max(errors) <= TOLERANCE[torch.float32] and right and clear, (rank, errors, right, clear)


def _ways_of_reducing():
    from iris.ops._fused import concurrent_programs
    from iris.ops.matmul_reduce import sends_by_copies

    ctx = iris.iris(1 << 22)
    device, world = ctx.get_device(), ctx.get_num_ranks()
    # more row blocks than programs whatever the fitted tile (at most 256 rows): more than one wave
    a = torch.zeros(256 * (concurrent_programs(ctx) + 1), 8, dtype=torch.bfloat16, device=device)
    b = torch.zeros(8, 32 * world, dtype=torch.bfloat16, device=device)
    ways = [sends_by_copies(ctx, config, a, b) for config in (  # the same choice for both reduce ops
        FusedConfig(), FusedConfig(comm_programs=1), FusedConfig(copy_engine=False))]
    ways += [sends_by_copies(ctx, FusedConfig(), a[:1], b),  # one tile: one wave
             sends_by_copies(ctx, FusedConfig(), a, b[:, :-1]),  # N not divisible by the ranks
             sends_by_copies(ctx, FusedConfig(copy_engine=True), a[:1], b)]  # as asked
    ctx.close()
    return ways


def test_reduce_ops_send_by_copies_where_a_block_has_more_than_one_wave(ranks):
    """copy_engine None: at 2 ranks (the world size measured), the reduce ops by copies where a member's N / W
    columns have more than one wave of tiles and nothing stands in the way (communication programs; columns not
    divisible by the ranks); beyond 2 ranks by pushes unless asked."""
    _skip_where_copies_are_refused(ranks)
    by_default = ranks.world_size == 2
    for ways in ranks.run(_ways_of_reducing):
        assert ways == [by_default, False, False, False, False, True]


def test_matmul_reduce_scatter_with_partials_pushed_by_programs_matches_float64(ranks):
    """FusedConfig(copy_engine=False): the pushing kernel, as where copies are refused or one wave suffices."""
    for shape in ((40, 70, 24), (200, 64, 48)):
        for rank, errors in enumerate(ranks.run(_run_op, "matmul_reduce_scatter", *shape, torch.float32, True,
                                                seeds=[1, 2], config=FusedConfig(copy_engine=False))):
            assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"


def _refusals():
    ctx = iris.iris(1 << 20)
    device = ctx.get_device()
    a = torch.zeros(8, 4, dtype=torch.bfloat16, device=device)
    b = torch.zeros(4, 16, dtype=torch.bfloat16, device=device)
    out = torch.zeros(8, 16, device=device)
    world = ctx.get_num_ranks()
    messages = refusals([lambda: ctx.ops.matmul_all_reduce(out, a, b[:3]),
                         lambda: ctx.ops.matmul_all_reduce(out, a.double(), b.double()),
                         lambda: ctx.ops.matmul_all_reduce(out, a, b, bias=torch.zeros(5, device=device)),
                         lambda: ctx.ops.matmul_all_gather(torch.zeros(world * 8, 16, device=device), a, b),
                         lambda: ctx.ops.matmul_reduce_scatter(out, a, b[:, :15]),
                         lambda: ctx.ops.all_gather_matmul(out, a, b),
                         lambda: ctx.ops.matmul_all_reduce(out[:, :8], a, b),
                         lambda: ctx.ops.matmul_all_reduce(
                             out, a, b, workspace=ctx.ops.matmul_reduce_scatter_preamble(out[:, :16 // world], a, b)),
                         lambda: ctx.ops.all_gather_matmul(out, torch.zeros(4, 8, dtype=a.dtype, device=device).t(),
                                                           torch.zeros(4 * world, 16, dtype=b.dtype, device=device),
                                                           config=FusedConfig(copy_engine=True)),
                         lambda: ctx.ops.matmul_reduce_scatter(out[:, :16 // world], a, b,
                                                               config=FusedConfig(copy_engine=True, comm_programs=1)),
                         lambda: ctx.ops.matmul_all_reduce(torch.zeros(8, 15, device=device), a, b[:, :15],
                                                           config=FusedConfig(copy_engine=True)),
                         lambda: ctx.ops.matmul_all_reduce(out, a, b,
                                                           config=FusedConfig(copy_engine=True, reduce_at_owner=True)),
                         lambda: ctx.ops.matmul_all_reduce(out, a, b,
                                                           config=FusedConfig(pipeline_chunks=2, copy_engine=True))])
    ctx.close()
    return messages


def test_fused_ops_refuse_bad_operands_before_any_launch(ranks):
    for messages in ranks.run(_refusals):
        assert "inner sizes differ" in messages[0]
        assert "has dtype torch.float64; supported: bfloat16, float16, float32" in messages[1]
        assert "bias must be 1-D of length 16" in messages[2]
        assert "output is not on the symmetric heap" in messages[3]
        assert "B has 15 columns, not divisible by the" in messages[4]
        assert "B has 4 rows; it needs" in messages[5]
        assert "output must have shape (8, 16)" in messages[6]
        assert "this workspace was made for another problem" in messages[7]
        assert "copy_engine=True) sends A_shard in one copy per member, so it must be contiguous" in messages[8]
        assert "copy_engine=True and comm_programs=1): the partials go by copies or by" in messages[9]
        assert "B has 15 columns, not divisible by the" in messages[10]
        assert "copy_engine=True and reduce_at_owner=True): with copies each member sums" in messages[11]
        assert "pipeline_chunks=2 and copy_engine=True): the chunks' sums go by iris.ccl.all_reduce" in messages[12]


@pytest.mark.parametrize("field,value", [("block_size_m", 8), ("block_size_n", 100), ("group_size_m", 3),
                                         ("num_warps", 0), ("num_stages", True), ("comm_programs", -1),
                                         ("reduce_at_owner", 1), ("copy_engine", 1), ("split_k", 0),
                                         ("split_k", True), ("pipeline_chunks", -1), ("pipeline_chunks", 2.0),
                                         ("vendor_gemm", 1), ("pipeline_comm_sms", 0),
                                         ("pipeline_comm_sms", 2.0)])
def test_fused_config_names_the_bad_field_and_value(field, value):
    with pytest.raises(ValueError) as info:
        FusedConfig(**{field: value})
    assert f"FusedConfig.{field}={value!r}" in str(info.value)


def test_a_k_split_and_tma_loads_do_not_mix():
    with pytest.raises(ValueError, match="split_k=2 and tma_loads=True"):
        FusedConfig(split_k=2, tma_loads=True)


@pytest.mark.parametrize("other", [dict(comm_programs=1), dict(reduce_at_owner=True)])
def test_pipelined_chunks_and_the_fused_kernels_own_exchanges_do_not_mix(other):
    with pytest.raises(ValueError, match=f"pipeline_chunks=2 and {next(iter(other))}="):
        FusedConfig(pipeline_chunks=2, **other)


def test_the_pipelines_gemm_leaves_the_sums_fewer_sms_where_its_share_of_k_is_deep():
    """pipeline_comm_sms None: 16 SMs for the sums where this rank's K is shallow (the sums take longer than the
    GEMM), 8 from DEEP_K on (4 x H100: 6-10% faster at K 3584 per rank, 7-10% slower at 2048); given: as given."""
    from iris.ops.pipelined import DEEP_K, gemm_programs
    assert gemm_programs(132, None, 2048) == 116 and gemm_programs(132, None, DEEP_K) == 124
    assert gemm_programs(132, 32, 8192) == 100 and gemm_programs(16, 32, 64) == 1


def test_the_pipelines_sms_for_the_sums_need_the_pipeline_by_iris_gemm():
    with pytest.raises(ValueError, match="pipeline_chunks=0 and pipeline_comm_sms=32"):
        FusedConfig(pipeline_chunks=0, pipeline_comm_sms=32)
    with pytest.raises(ValueError, match="vendor_gemm=True and pipeline_comm_sms=32"):
        FusedConfig(vendor_gemm=True, pipeline_comm_sms=32)


def test_owner_reduce_and_communication_programs_do_not_mix():
    with pytest.raises(ValueError, match="reduce_at_owner=True and comm_programs=2"):
        FusedConfig(reduce_at_owner=True, comm_programs=2)


def test_the_vendor_gemm_and_pushes_by_the_programs_do_not_mix():
    with pytest.raises(ValueError, match="vendor_gemm=True and copy_engine=False"):
        FusedConfig(vendor_gemm=True, copy_engine=False)
    FusedConfig(vendor_gemm=True, copy_engine=True)  # the copies it takes anyway
