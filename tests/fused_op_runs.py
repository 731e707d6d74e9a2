"""What the fused ops' tests share (tests/test_ops*.py, split in four so that the GPU gate's workers take
them side by side): a run of one op on every rank of a pool, checked against the float64 result from every
rank's shards; the skip where copies are refused; the tile parts a call hands over; whether TMA loads are
taken."""

import pytest
import torch

import iris
from iris.testing.fused_ops import ON_HEAP, copy_refusal_in, magnitude, reference, shapes

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def shards_of(seed, rank, a_shape, b_shape, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randn(*a_shape, generator=g).to(dtype), torch.randn(*b_shape, generator=g).to(dtype)


def relative_error(op, got, seed, rank, world, a_shape, b_shape, bias=None, in_dtype=torch.bfloat16):
    """``got``'s relative error against the float64 result from every rank's shards of ``seed`` (inf where ``got``
    holds a NaN: a tile never written)."""
    shards = [shards_of(seed, r, a_shape, b_shape, in_dtype) for r in range(world)]
    ref, scale = reference(op, shards, bias, rank), magnitude(op, shards, bias, rank)
    got = got.cpu().double()
    return float("inf") if got.isnan().any() else ((got - ref).norm() / scale.norm()).item()


def run_op(op, m, n, k, out_dtype, with_bias, seeds, config=None, in_dtype=torch.bfloat16):
    ctx = iris.iris(1 << 24)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    a_shape, b_shape, out_shape = shapes(op, m, n, k, world)
    errors = []
    for seed in seeds:  # the same problem again: the kept workspace, flags counted further
        a, b = shards_of(seed, rank, a_shape, b_shape, in_dtype)
        bias = torch.randn(b_shape[1], generator=torch.Generator().manual_seed(seed)) if with_bias else None
        out = (ctx.full if op in ON_HEAP else torch.full)(out_shape, float("nan"), dtype=out_dtype, device=device)
        getattr(ctx.ops, op)(out, a.to(device), b.to(device), bias=None if bias is None else bias.to(device),
                             config=config)
        ctx.barrier()
        errors.append(relative_error(op, out, seed, rank, world, a_shape, b_shape, bias, in_dtype))
    ctx.close()
    return errors


def skip_where_copies_are_refused(pool):
    """copy_engine needs one GPU per rank: a pool with more ranks than GPUs is refused (the op's own check)."""
    refusal = copy_refusal_in(pool)
    if refusal:
        pytest.skip(refusal)


def parts_handed_over(m, n, k, config, op="all_gather_matmul"):
    """How many tile parts a call of ``op`` hands over (its workspace's part flags; none without a split)."""
    ctx = iris.iris(1 << 20)
    world, device = ctx.get_num_ranks(), ctx.get_device()
    a_shape, b_shape, out_shape = shapes(op, m, n, k, world)
    a, b = (torch.zeros(*shape, dtype=torch.bfloat16, device=device) for shape in (a_shape, b_shape))
    _, spec = ctx.ops.workspace_layout(op, torch.zeros(out_shape, device=device), a, b, config)
    ctx.close()
    return spec["ready"].numel if "ready" in spec else 0


def run_op_with_free_parts(op, m, n, k, out_dtype, with_bias, seeds, config=None):
    """(parts handed over, run_op's errors) where the fitting takes K parts for free (SPLIT_COST below zero, from
    any row count): on the CPU backend's one program only the last tile is split, after the others ran whole."""
    from iris.ops import _fused

    saved = _fused.SPLIT_COST, _fused.SPLIT_MIN_ROWS
    _fused.SPLIT_COST, _fused.SPLIT_MIN_ROWS = -0.2, 0
    try:
        return parts_handed_over(m, n, k, config, op), run_op(op, m, n, k, out_dtype, with_bias, seeds, config)
    finally:
        _fused.SPLIT_COST, _fused.SPLIT_MIN_ROWS = saved


def takes_tma(op, m, n, k, config):
    from iris.ops._fused import tma_loads

    ctx = iris.iris(1 << 20)
    a_shape, b_shape, _ = shapes(op, m, n, k, ctx.get_num_ranks())
    a, b = (torch.zeros(shape, dtype=torch.bfloat16, device=ctx.get_device()) for shape in (a_shape, b_shape))
    taken = tma_loads(ctx, config, a, b) and not tma_loads(ctx, config, a.t().contiguous().t(), b)
    ctx.close()
    return taken
