"""ctx.ops' five fused ops against a float64 reference built from every rank's shards: what every op shares
(dtypes, k-splits, TMA loads, refusals). all_gather_matmul's own ways of sending are in test_ops_all_gather.py;
the reduce ops' (the pipeline, owner-reduce, copies) in test_ops_reduce.py; replayed calls in test_ops_replay.py.
(Four files, so that the GPU gate's --dist loadfile runs them side by side.)"""


import pytest
import torch

import iris
from iris.ops import FusedConfig
from iris.testing import refusals
from iris.testing.fused_ops import OPS
from fused_op_runs import (TOLERANCE, run_op, run_op_with_free_parts, takes_tma)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("shape,out_dtype", [((40, 70, 24), torch.float32), ((64, 32, 50), torch.bfloat16)])
def test_fused_op_matches_float64(ranks, op, shape, out_dtype):
    for rank, errors in enumerate(ranks.run(run_op, op, *shape, out_dtype, out_dtype == torch.float32,
                                            seeds=[1, 2])):
        assert max(errors) <= TOLERANCE[out_dtype], f"{op}, rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("op", OPS)
def test_fused_op_takes_float32_operands(ranks, op):
    """float32 A and B (the original's tests use them): TF32 on GPUs, so the bfloat16 tolerance."""
    for rank, errors in enumerate(ranks.run(run_op, op, 40, 70, 24, torch.float32, True, seeds=[3],
                                            in_dtype=torch.float32)):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"{op}, rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("op", ["matmul_all_gather", "gemm_all_scatter"])
@pytest.mark.parametrize("split_k", [2, 3])
def test_gather_ops_with_k_split_match_float64(ranks, op, split_k):
    """FusedConfig(split_k=S): S programs per tile, each over a part of K (K 100 in steps of 32: with 3
    parts the last one is empty), the last adding the others'; called again, the parts' flags start over."""
    config = FusedConfig(split_k=split_k)
    for rank, errors in enumerate(ranks.run(run_op, op, 72, 80, 100, torch.float32, True, seeds=[3, 4, 5],
                                            config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"{op}, rank {rank}: relative errors {errors}"
    for rank, errors in enumerate(ranks.run(run_op, op, 40, 70, 100, torch.bfloat16, False, seeds=[6],
                                            config=config)):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"{op}, rank {rank}: relative errors {errors}"


@pytest.mark.parametrize("op", ["matmul_all_gather", "gemm_all_scatter", "all_gather_matmul"])
def test_fused_ops_with_a_fitted_last_round_split_match_float64(ranks, op):
    """The fitted split of the last round's tiles (whole tiles first, then the parts; K 100: matmul_all_gather's
    4 parts of 32, 32, 32 and 4), over calls that reuse the workspace."""
    for rank, (handed, errors) in enumerate(ranks.run(run_op_with_free_parts, op, 72, 80, 100, torch.float32, True,
                                                      seeds=[3, 4])):
        assert handed >= 1, f"{op}, rank {rank}: no part handed over"
        assert max(errors) <= TOLERANCE[torch.float32], f"{op}, rank {rank}: relative errors {errors}"


def test_a_k_split_is_fitted_where_the_default_tile_leaves_most_programs_idle():
    """fitted_launch() with the K splits matmul_all_gather takes: from 256 output rows, the default tile cut in 2 or 4
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


def test_a_tile_is_fitted_within_the_gpus_shared_memory():
    """fitted_launch(within=(backend, bytes)), as IRIS_GEMM_FIT_TILES gives it: the default candidates that need
    more shared memory than the GPU has are passed over, the default tile at fewer stages where none fits, and a
    tile set by hand that does not fit is refused before any launch, naming what it needs. gfx942 (64 KiB, AMD's
    pipeliner: a stage fewer) keeps the half tile (128 x 128 x 64, 3 stages: 65536 bytes); sm_90 keeps all."""
    from iris.ops._fused import SPLITS, fitted_launch
    from iris.runtime import backend_class

    hip, cuda = (backend_class("hip"), 65536), (backend_class("cuda"), 232448)

    def fitted(rows, cols, within, config=FusedConfig(), splits=SPLITS):
        launch = fitted_launch(config, rows, cols, 304, torch.bfloat16, splits, within=within)
        return launch["BLOCK_M"], launch["BLOCK_N"], launch["num_stages"], launch.get("SPLIT")

    assert fitted(4096, 8192, cuda) == (128, 256, 3, 1)  # as without a limit
    assert fitted(4096, 8192, hip) == (128, 128, 3, 1)  # the default tile needs 98304 bytes there
    assert fitted(64, 8192, hip) == (128, 128, 3, 1)  # the small tile needs 73728
    assert fitted(4096, 8192, (backend_class("hip"), 50000)) == (128, 256, 2, 1)  # none fits: fewer stages
    with pytest.raises(ValueError, match=r"needs 98304 bytes of shared memory per program; this GPU has 65536"):
        fitted(4096, 8192, hip, config=FusedConfig(block_size_n=256, num_stages=3, num_warps=4))
    with pytest.raises(ValueError, match="3 stages needs 147456 bytes .* has 40000"):
        fitted(4096, 8192, (backend_class("cuda"), 40000))  # not even one stage


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter", "matmul_all_gather",
                                "gemm_all_scatter", "all_gather_matmul"])
def test_fused_op_with_tma_loads_matches_float64(ranks, op):
    """FusedConfig(tma_loads=True): operand tiles through tensor descriptors, ragged edges zero-filled."""
    config = FusedConfig(tma_loads=True)
    assert all(ranks.run(takes_tma, op, 72, 80, 64, config))  # 16-byte rows: the descriptors are used
    for rank, errors in enumerate(ranks.run(run_op, op, 72, 80, 64, torch.float32, True, seeds=[8, 9],
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
                                         ("vendor_gemm", 1), ("tma_loads", "yes"), ("pipeline_comm_sms", 0),
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
    from iris.ops.matmul_all_reduce.pipelined import DEEP_K, gemm_programs
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
