"""The reduce ops (matmul_all_reduce, matmul_reduce_scatter) against a float64 reference: communication
programs, owner-reduce, the pipeline by row chunks, partials sent by copies."""

import pytest
import torch

import iris
from iris.ops import FusedConfig
from iris.testing import refusals
from iris.testing.fused_ops import shapes
from fused_op_runs import TOLERANCE, relative_error, run_op, shards_of, skip_where_copies_are_refused


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter"])
@pytest.mark.parametrize("comm_programs", [1, 3])
def test_reduce_ops_with_communication_programs_match_float64(ranks, op, comm_programs):
    """Workgroup specialization: programs that only exchange and sum the tiles the others stage."""
    config = FusedConfig(comm_programs=comm_programs)
    for rank, errors in enumerate(ranks.run(run_op, op, 72, 80, 40, torch.float32, True, seeds=[3, 4, 5],
                                            config=config)):
        assert max(errors) <= TOLERANCE[torch.float32], f"{op}, rank {rank}: relative errors {errors}"



@pytest.mark.parametrize("reduce_at_owner", [True, False, None])
def test_matmul_all_reduce_with_and_without_owner_reduce_matches_float64(ranks, reduce_at_owner):
    """Owner-reduce (each tile summed by one owner, from which every other member reads the sum) and
    push-to-all, forced either way and as picked by world size, over calls that reuse the workspace."""
    config = FusedConfig(reduce_at_owner=reduce_at_owner, copy_engine=False)
    for rank, errors in enumerate(ranks.run(run_op, "matmul_all_reduce", 72, 80, 40, torch.float32, True,
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
        a, b = (t.to(device) for t in shards_of(seed, rank, a_shape, b_shape, torch.bfloat16))
        bias = torch.randn(b_shape[1], generator=torch.Generator().manual_seed(seed)).to(device)
        plain = torch.full(out_shape, float("nan"), dtype=out_dtype, device=device)
        on_heap = ctx.full(out_shape, float("nan"), dtype=out_dtype)
        ctx.ops.matmul_all_reduce(plain, a, b, bias=bias, config=config)
        ctx.ops.matmul_all_reduce(on_heap, a, b, bias=bias, config=config)
        ctx.barrier()
        errors = [relative_error("matmul_all_reduce", got, seed, rank, world, a_shape, b_shape, bias.cpu())
                  for got in (plain, on_heap)]
        results.append((errors, torch.equal(plain.cpu(), on_heap.cpu())))
    ctx.close()
    return results


@pytest.mark.parametrize("chunks,comm_sms", [(1, None), pytest.param(5, None, marks=pytest.mark.slow), (2, 40)])
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


def _variant_refusals(variants):
    ctx = iris.iris(1 << 22)
    a_shape, b_shape, out_shape = shapes("matmul_all_reduce", 40, 48, 24, ctx.get_num_ranks())
    a, b = (torch.ones(shape, dtype=torch.bfloat16, device=ctx.get_device()) for shape in (a_shape, b_shape))
    out = torch.zeros(out_shape, dtype=torch.float32, device=ctx.get_device())
    messages = refusals([lambda v=v: ctx.ops.matmul_all_reduce(out, a, b, config=FusedConfig(all_reduce_variant=v))
                         for v in variants])
    untouched = bool((out == 0).all())
    ctx.close()
    return messages, untouched


def test_matmul_all_reduce_refuses_the_variants_the_originals_newest_release_dropped(ranks):
    """The original's newest matmul_all_reduce takes only one_shot and two_shot (Iris's own push, ll and
    hierarchical sum its pipeline's chunks); atomic, spinlock and ring are refused before any launch."""
    for messages, untouched in ranks.run(_variant_refusals, ("atomic", "spinlock", "ring")):
        assert untouched and all("matmul_all_reduce supports only" in m and v in m
                                 for m, v in zip(messages, ("'atomic'", "'spinlock'", "'ring'"))), messages


def test_matmul_all_reduce_pipelined_at_three_ranks_matches_float64(three_ranks):
    for rank, results in enumerate(three_ranks.run(_pipelined, 40, 72, 24, 3, seeds=[6])):
        for errors, same in results:
            assert max(errors) <= TOLERANCE[torch.float32] and same, f"rank {rank}: {errors}, {same}"


def test_the_pipeline_by_default_from_4_ranks_and_4096_rows():
    """pipeline_chunks None: 4 chunks where measured faster or level (4 x H100: M 16384 4-22%, M 4096 N 8192 11%),
    else the fused kernel."""
    from iris.ops.matmul_all_reduce.pipelined import default_chunks

    assert [default_chunks(world, rows) for world, rows in ((2, 16384), (3, 16384), (4, 1024), (4, 4095))] == [0] * 4
    assert [default_chunks(world, rows) for world, rows in ((4, 4096), (4, 16384), (8, 65536))] == [4] * 3


def test_the_fused_kernel_is_kept_where_a_mode_of_it_or_a_variant_without_any_chunk_in_place_is_given():
    """Code written for the original may pass any all_reduce_variant (no effect on the fused kernel): the ones that
    cannot sum every chunk in place keep pipeline_chunks=None on the fused kernel, as its own modes do."""
    from iris.ops.matmul_all_reduce.pipelined import fused_kernel_asked_for

    kept = [FusedConfig(reduce_at_owner=True), FusedConfig(reduce_at_owner=False), FusedConfig(comm_programs=1),
            FusedConfig(copy_engine=True), FusedConfig(copy_engine=False)]
    kept += [FusedConfig(all_reduce_variant=v) for v in ("one_shot", "atomic", "spinlock", "ring", "push", "ll")]
    pipelined = [FusedConfig(), FusedConfig(all_reduce_variant="two_shot"),
                 FusedConfig(all_reduce_variant="hierarchical"), FusedConfig(block_size_n=128)]
    assert all(map(fused_kernel_asked_for, kept)) and not any(map(fused_kernel_asked_for, pipelined))


def _pipelines_chosen():
    from iris.ops._fused import copy_refusal
    from iris.ops.matmul_all_reduce.pipelined import chunks

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
    pipelines = ctx.team.backend.has_streams and copy_refusal(ctx) is None and world >= 4
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
    for rank, errors in enumerate(three_ranks.run(run_op, op, 40, 72, 24, torch.bfloat16, True, seeds=[6, 7])):
        assert max(errors) <= TOLERANCE[torch.bfloat16], f"{op}, rank {rank}: relative errors {errors}"


def _scatter_by_copies(m, n, k, seeds):
    """matmul_reduce_scatter with FusedConfig(copy_engine=True) into an (M, N / W) output: the errors of each
    call, and the chunks' flags all clear after the last call (the finish clears them for the next call)."""
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    config = FusedConfig(copy_engine=True)
    a_shape, b_shape, out_shape = shapes("matmul_reduce_scatter", m, n, k, world)
    errors = []
    for seed in seeds:
        a, b = (t.to(device) for t in shards_of(seed, rank, a_shape, b_shape))
        bias = torch.randn(b_shape[1], generator=torch.Generator().manual_seed(seed))
        out = torch.full(out_shape, float("nan"), device=device)
        workspace = ctx.ops.matmul_reduce_scatter(out, a, b, bias=bias.to(device), config=config)
        ctx.barrier()
        errors.append(relative_error("matmul_reduce_scatter", out, seed, rank, world, a_shape, b_shape, bias))
    clear = not workspace.flags.any().item()
    ctx.close()
    return errors, clear


def _in_the_originals_layout(m, n, k, block, seeds, comm_programs):
    """matmul_reduce_scatter into an (M, N) output: per call, the relative error against the float64 sum over
    the ranks at this rank's run of block x block blocks (row-major, blocks // W each, the last rank the rest)
    and the largest magnitude anywhere else (the original Iris zeroes it)."""
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    config = FusedConfig(block_size_m=block, block_size_n=block, comm_programs=comm_programs)
    blocks_n = -(-n // block)
    blocks = -(-m // block) * blocks_n
    first, count = rank * (blocks // world), blocks // world
    if rank == world - 1:
        count = blocks - first
    mine = torch.zeros(m, n, dtype=torch.bool)
    for index in range(first, first + count):
        row, col = divmod(index, blocks_n)
        mine[row * block:(row + 1) * block, col * block:(col + 1) * block] = True
    results = []
    for seed in seeds:
        shards = [shards_of(seed, r, (m, k), (k, n)) for r in range(world)]  # bf16: exact products on any GPU
        out = torch.full((m, n), float("nan"), device=device)
        ctx.ops.matmul_reduce_scatter(out, shards[rank][0].to(device), shards[rank][1].to(device), config=config)
        ctx.barrier()
        want = sum(a.double() @ b.double() for a, b in shards)
        got = out.cpu().double()
        inside = ((got - want)[mine].norm() / want[mine].norm()).item() if mine.any() else 0.0
        results.append((inside, got[~mine].abs().max().item() if (~mine).any() else 0.0))
    ctx.close()
    return results


@pytest.mark.parametrize("m,n,block,comm_programs", [(90, 70, 32, 0), (40, 24, 16, 2), (20, 20, 32, 0)])
def test_matmul_reduce_scatter_into_an_m_by_n_output_gives_each_rank_its_run_of_blocks(ranks, m, n, block,
                                                                                        comm_programs):
    """The original Iris's layout (its tests index it by FusedConfig's block sizes, not the kernel's tile): 9
    blocks of 32 over 2 ranks (4 and 5), 6 of 16 by the communication programs, one block (all to the last
    rank); zeros outside a rank's run; over calls that reuse the workspace."""
    for rank, results in enumerate(ranks.run(_in_the_originals_layout, m, n, 24, block, [1, 2], comm_programs)):
        for inside, outside in results:
            assert inside <= TOLERANCE[torch.float32] and outside == 0.0, \
                f"rank {rank}: relative error {inside} in its run, {outside} outside"


@pytest.mark.parametrize("shape", [(40, 70, 24), (200, 64, 48)])
def test_matmul_reduce_scatter_with_partials_sent_by_copies_matches_float64(ranks, shape):
    """FusedConfig(copy_engine=True): one launch computes the partials of the other members' columns into a
    local stage, copies (the copy engine on a GPU) send them to their owners by row chunks, each chunk's flag
    after it, and a second launch computes this rank's own columns and adds the members' partials chunk by
    chunk as their flags arrive (M 200: 7 row blocks of the interpreter's 32, 7 chunks), over calls that reuse
    the workspace."""
    skip_where_copies_are_refused(ranks)
    for rank, (errors, clear) in enumerate(ranks.run(_scatter_by_copies, *shape, seeds=[3, 4])):
        assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"
        assert clear, f"rank {rank}: flags left set"


def test_matmul_reduce_scatter_by_copies_at_three_ranks_matches_float64(three_ranks):
    skip_where_copies_are_refused(three_ranks)
    for rank, (errors, clear) in enumerate(three_ranks.run(_scatter_by_copies, 72, 48, 40, seeds=[6])):
        assert max(errors) <= TOLERANCE[torch.float32] and clear, f"rank {rank}: relative errors {errors}"


def _all_reduce_by_copies(m, n, k, seeds):
    """matmul_all_reduce with FusedConfig(copy_engine=True): run_op's errors, and the flags all clear after."""
    errors = run_op("matmul_all_reduce", m, n, k, torch.float32, True, seeds, config=FusedConfig(copy_engine=True))
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
    skip_where_copies_are_refused(ranks)
    for rank, (errors, right, clear) in enumerate(ranks.run(_all_reduce_by_copies, *shape, seeds=[3, 4])):
        assert max(errors) <= TOLERANCE[torch.float32] and right and clear, (rank, errors, right, clear)


def test_matmul_all_reduce_by_copies_at_three_ranks_matches_float64(three_ranks):
    skip_where_copies_are_refused(three_ranks)
    for rank, (errors, right, clear) in enumerate(three_ranks.run(_all_reduce_by_copies, 72, 48, 48, seeds=[6])):
        assert max(errors) <= TOLERANCE[torch.float32] and right and clear, (rank, errors, right, clear)


def _ways_of_reducing():
    from iris.ops._fused import concurrent_programs
    from iris.ops.matmul_all_reduce.kernel import sends_by_copies

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
    skip_where_copies_are_refused(ranks)
    by_default = ranks.world_size == 2
    for ways in ranks.run(_ways_of_reducing):
        assert ways == [by_default, False, False, False, False, True]


def test_matmul_reduce_scatter_with_partials_pushed_by_programs_matches_float64(ranks):
    """FusedConfig(copy_engine=False): the pushing kernel, as where copies are refused or one wave suffices."""
    for shape in ((40, 70, 24), (200, 64, 48)):
        for rank, errors in enumerate(ranks.run(run_op, "matmul_reduce_scatter", *shape, torch.float32, True,
                                                seeds=[1, 2], config=FusedConfig(copy_engine=False))):
            assert max(errors) <= TOLERANCE[torch.float32], f"rank {rank}: relative errors {errors}"
