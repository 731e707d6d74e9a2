"""A fused op called again: its launches replayed on new data in the same tensors, a changed config taking new
launches, and no operand of a remembered call kept alive."""

import gc
import weakref

import pytest
import torch

import iris
from iris.ops import FusedConfig
from iris.testing.fused_ops import ON_HEAP, OPS, shapes
from fused_op_runs import TOLERANCE, relative_error, shards_of, skip_where_copies_are_refused


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
        shard_a, shard_b = shards_of(seed, rank, a_shape, b_shape)
        a.copy_(shard_a)
        b.copy_(shard_b)
        out.fill_(float("nan"))
        ctx.barrier()
        workspace = getattr(ctx.ops, op)(out, a, b, config=config)
        ctx.barrier()
        errors.append(relative_error(op, out, seed, rank, world, a_shape, b_shape))
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
        a, b = (shard.to(device) for shard in shards_of(seed, rank, a_shape, b_shape))
        bias = torch.randn(b_shape[1], generator=torch.Generator().manual_seed(seed))
        out = torch.empty(out_shape, dtype=torch.bfloat16, device=device)
        for _ in range(2):  # remembered, then replayed
            getattr(ctx.ops, op)(out, a, b, bias=bias.to(device), config=config)
        ctx.barrier()
        errors.append(relative_error(op, out, seed, rank, world, a_shape, b_shape, bias))
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
        skip_where_copies_are_refused(ranks)
    for alive, errors in ranks.run(_operands_kept_alive, op, config):
        assert not any(alive), alive
        assert max(errors) <= TOLERANCE[torch.bfloat16], errors
