"""The five fused ops of :mod:`iris.ops` as problems with a float64 answer, for the tests and the suite.

``ON_HEAP``: the ops whose output peers write, so it must be a heap tensor.
"""

from __future__ import annotations

import torch

OPS = ("matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul", "matmul_all_gather", "gemm_all_scatter")
ON_HEAP = ("matmul_all_gather", "gemm_all_scatter")


def shapes(op: str, m: int, n: int, k: int, world: int) -> tuple[tuple, tuple, tuple]:
    """(A, B, output) shapes on one rank. reduce_scatter: n is rounded up to a multiple of the world."""
    if op == "matmul_all_reduce":
        return (m, k), (k, n), (m, n)
    if op == "matmul_reduce_scatter":
        n = -(-n // world) * world
        return (m, k), (k, n), (m, n // world)
    if op == "all_gather_matmul":
        return (m, k), (world * k, n), (m, n)
    if op == "matmul_all_gather":
        return (m, k), (k, n), (world * m, n)
    if op == "gemm_all_scatter":
        return (m, k), (k, n), (m, world * n)
    raise ValueError(f"unknown op {op!r}; one of {OPS}")


def reference(op: str, shards: list, bias, rank: int) -> torch.Tensor:
    """Rank ``rank``'s output in float64; ``shards[r]`` = rank r's (A, B), ``bias`` (N,) or None."""
    world = len(shards)
    plus = bias.double() if bias is not None else 0.0
    if op == "all_gather_matmul":
        gathered = torch.cat([a.double() for a, _ in shards], dim=1)
        return gathered @ shards[rank][1].double() + plus
    products = [a.double() @ b.double() for a, b in shards]
    if op == "matmul_all_reduce":
        return sum(products) + plus
    if op == "matmul_reduce_scatter":
        whole = sum(products) + plus
        width = whole.shape[1] // world
        return whole[:, rank * width:(rank + 1) * width]
    if op == "matmul_all_gather":
        return torch.cat([p + plus for p in products], dim=0)
    if op == "gemm_all_scatter":
        return torch.cat([p + plus for p in products], dim=1)
    raise ValueError(f"unknown op {op!r}; one of {OPS}")


def magnitude(op: str, shards: list, bias, rank: int) -> torch.Tensor:
    """Like :func:`reference` over absolute values: the scale of the error, since a sum that cancels keeps
    its terms' rounding."""
    absolute = [(a.double().abs(), b.double().abs()) for a, b in shards]
    return reference(op, absolute, None if bias is None else bias.double().abs(), rank)


def _copy_refusal():
    """(On a rank) why FusedConfig(copy_engine=True) cannot run in this job, or None."""
    import iris
    from iris.ops._fused import copy_refusal

    ctx = iris.iris(1 << 20)
    refusal = copy_refusal(ctx)
    ctx.close()
    return refusal


def copy_refusal_in(pool) -> str | None:
    """Why ``pool``'s job refuses all_gather_matmul's copies, or None; tests skip with it."""
    return pool.run(_copy_refusal)[0]
