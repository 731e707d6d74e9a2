"""Ranks that call a collective differently get an error naming each rank's call, in normal mode, before any
launch (they used to hang or compute garbage silently): the first call of each distinct call (op, shapes, dtypes,
settings) is compared across ranks once (IRIS_AGREEMENT_CHECK); repeated calls are not compared again."""

import os

import pytest
import torch

import iris
from iris.ccl import ReduceOp


def _disagree(case, setting=None):
    if setting is not None:
        os.environ["IRIS_AGREEMENT_CHECK"] = setting
    try:
        return _call_differently(case)
    finally:
        os.environ.pop("IRIS_AGREEMENT_CHECK", None)


def _call_differently(case):
    ctx = iris.iris(1 << 20)
    rank = ctx.get_rank()
    agreed = ctx.ones(256)
    ctx.ccl.all_reduce(agreed, agreed)  # a call every rank makes alike passes
    try:
        if case == "elements":  # 1024 elements against 2048: it hung
            x = ctx.ones(1024 if rank == 0 else 2048)
            ctx.ccl.all_reduce(x, x)
        elif case == "dtype":  # float32 against bfloat16: wrong values
            x = ctx.ones(512, dtype=torch.float32 if rank == 0 else torch.bfloat16)
            ctx.ccl.all_reduce(x, x)
        elif case == "root":  # broadcast from 0 on one rank, from 1 on the other: wrong values
            ctx.ccl.broadcast(ctx.ones(64), src=rank)
        elif case == "op":
            x = ctx.ones(64)
            ctx.ccl.all_reduce(x, x, op=ReduceOp.MAX if rank == 0 else ReduceOp.SUM)
        elif case == "fused":
            inner = 32 if rank == 0 else 16  # a fused op: each rank's own product is well formed
            ctx.ops.matmul_all_reduce(ctx.zeros(8, 16), ctx.ones(8, inner), ctx.ones(inner, 16))
        error = None
    except ValueError as caught:
        error = str(caught)
    checks = ctx.team.calls_compared
    ctx.close()
    return error, checks


EXPECTED = {
    "elements": "input_tensor: rank 0 (1024,) float32, rank 1 (2048,) float32",
    "dtype": "input_tensor: rank 0 (512,) float32, rank 1 (512,) bfloat16",
    "root": "src: rank 0 0, rank 1 1",
    "op": "op: rank 0 <ReduceOp.MAX",
    "fused": "A: rank 0 (8, 32) float32, rank 1 (8, 16) float32",
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_ranks_that_call_a_collective_differently_get_an_error_naming_each_call(ranks, case):
    for rank, (error, checks) in enumerate(ranks.run(_disagree, case)):
        assert error is not None, f"rank {rank}: no error for ranks that disagree on {case}"
        assert "the ranks of the group called it differently" in error, error
        assert EXPECTED[case] in error, error
        assert "IRIS_AGREEMENT_CHECK" in error, error
        assert checks == 2, checks


def test_the_check_can_be_turned_off(ranks):
    for error, checks in ranks.run(_disagree, "root", "0"):
        assert checks == 0  # nothing compared (the broadcast's values are then wrong, silently, as before)


def _repeat_calls():
    ctx = iris.iris(1 << 20)
    x, y = ctx.ones(256), ctx.ones(512)
    seen = []
    for tensor in (x, x, x, y, y, x):
        ctx.ccl.all_reduce(tensor, tensor)
        seen.append(ctx.team.calls_compared)
    z = ctx.ones(256)  # another buffer of x's shape and dtype: a new plan, the same call, not compared again
    ctx.ccl.all_reduce(z, z)
    seen.append(ctx.team.calls_compared)
    ctx.ops.matmul_all_reduce(ctx.zeros(8, 16), ctx.ones(8, 32), ctx.ones(32, 16))
    seen.append(ctx.team.calls_compared)
    ctx.close()
    return seen


def test_each_distinct_call_is_compared_once(ranks):
    for seen in ranks.run(_repeat_calls):
        assert seen == [1, 1, 1, 2, 2, 2, 2, 3]
