"""All-reduce, residual add and RMSNorm in one kernel: ``ctx.ccl.all_reduce_rmsnorm(partial, residual, weight)``.

The step that ends every tensor-parallel transformer block: the sum over ranks of each rank's partial (tokens,
hidden) output is added to the residual stream (in place), and the result normalised row by row,
``out = residual * rsqrt(mean(residual ** 2) + eps) * weight``; for an fp8 GEMM next, ``out`` may be float8
e4m3 with ``out_scale`` (each row stored divided by ``amax(row) / 448``). One launch: past the group's barrier
each program reads its rows' partials from every member in member order (the same bits everywhere), rounds
the sum to the partial's dtype, adds and normalises in float32: no second pass over memory. Unless
``async_op``, a closing barrier keeps a member from overwriting its partial while another reads it. Only
``partial`` must be on the symmetric heap.

Example:
    >>> partial = ctx.empty(tokens, hidden, dtype=torch.bfloat16)   # a row-parallel GEMM writes it
    >>> out = ctx.ccl.all_reduce_rmsnorm(partial, residual, weight, eps=1e-6)   # residual updated in place
    >>> q = torch.empty(tokens, hidden, dtype=torch.float8_e4m3fn, device=partial.device)
    >>> scale = torch.empty(tokens, dtype=torch.float32, device=partial.device)
    >>> ctx.ccl.all_reduce_rmsnorm(partial, residual, weight, out=q, out_scale=scale)   # fp8, per-token scale
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.ccl import _common
from iris.ccl.reduction import reduce_block
from iris.device import tracing
from iris.device.barrier import GROUP_ARGS, enter, leave
from iris.device.tracing import elements_bytes

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: fp8 outputs (with a per-token scale): e4m3 as NVIDIA Hopper and newer and AMD MI350 store it. (The MI300's
#: e4m3fnuz is not among them: Triton 3.6's interpreter cannot convert to it.)
FP8_DTYPES = (torch.float8_e4m3fn,)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _all_reduce_rmsnorm_kernel(partial, residual, weight, out, out_scale, out_max, tokens, hidden, eps, members,
                               count, index, cur, heap_bases, arrivals, expected, programs, FUSED: tl.constexpr,
                               EXIT_BARRIER: tl.constexpr, WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr,
                               TRACE: tl.constexpr, BLOCK_H: tl.constexpr, QUANTIZE: tl.constexpr):
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, FUSED, BARRIER_BLOCK, TRACE)
    cols = tl.arange(0, BLOCK_H)
    inside = cols < hidden
    w = tl.load(weight + cols, mask=inside, other=0.0).to(tl.float32)
    for row in range(tl.program_id(0), programs, tl.num_programs(0)):
        span = trace.start(tracing.REDUCE, cur, -1, partial, row, -1, elements_bytes(partial, count * BLOCK_H))
        offs = tl.cast(row, tl.int64) * hidden + cols
        reduced = reduce_block(partial, offs, inside, members, count, 0, cur, heap_bases, "sum", tl.float32)
        reduced = reduced.to(partial.dtype.element_ty).to(tl.float32)  # the all_reduce's own rounding
        total = tl.load(residual + offs, mask=inside, other=0.0).to(tl.float32) + reduced
        total = total.to(residual.dtype.element_ty)
        tl.store(residual + offs, total, mask=inside)
        total = total.to(tl.float32)
        normed = total * tl.rsqrt(tl.sum(total * total, axis=0) / hidden + eps) * w
        if QUANTIZE:  # per token: the row's largest magnitude becomes the format's largest value
            scale = tl.maximum(tl.max(tl.abs(normed), axis=0), 1e-12) / out_max
            tl.store(out_scale + row, scale)
            normed = normed / scale
        tl.store(out + offs, normed.to(out.dtype.element_ty), mask=inside)
        trace.end(span)
    leave(arrivals, expected, members, count, cur, heap_bases, WORLD, EXIT_BARRIER, BARRIER_BLOCK, trace)


def _check(ctx, partial, residual, weight, out, out_scale) -> None:
    what = "all_reduce_rmsnorm"
    ctx.team.check_tensor(what, "partial", partial, DTYPES, symmetric=True)
    if partial.dim() != 2:
        raise ValueError(f"{what}: partial must be 2-D (tokens, hidden); got shape {tuple(partial.shape)}")
    ctx.team.check_tensor(what, "residual", residual, DTYPES, symmetric=False)
    if residual.shape != partial.shape:
        raise ValueError(f"{what}: residual has shape {tuple(residual.shape)}, partial {tuple(partial.shape)}")
    ctx.team.check_tensor(what, "weight", weight, DTYPES, symmetric=False)
    if weight.shape != (partial.shape[1],):
        raise ValueError(f"{what}: weight must have shape ({partial.shape[1]},) (hidden); got {tuple(weight.shape)}")
    ctx.team.check_tensor(what, "out", out, DTYPES + FP8_DTYPES, symmetric=False)
    if out.shape != partial.shape:
        raise ValueError(f"{what}: out has shape {tuple(out.shape)}, partial {tuple(partial.shape)}")
    if (out.dtype in FP8_DTYPES) != (out_scale is not None):
        raise ValueError(f"{what}: an fp8 out takes out_scale, a (tokens,) float32 tensor for each row's scale, and "
                         f"only an fp8 out does; got out {out.dtype} and out_scale "
                         f"{'None' if out_scale is None else tuple(out_scale.shape)}")
    if out.dtype in FP8_DTYPES and out.dtype not in ctx.backend.float8_formats(out.device):
        raise ValueError(f"{what}: out is {out.dtype}, which kernels cannot store on this device ({out.device}); "
                         f"its float8 formats: {list(ctx.backend.float8_formats(out.device)) or 'none'}. Use a "
                         "16-bit out")
    if out_scale is not None:
        ctx.team.check_tensor(what, "out_scale", out_scale, (torch.float32,), symmetric=False)
        if out_scale.shape != (partial.shape[0],):
            raise ValueError(f"{what}: out_scale must have shape ({partial.shape[0]},) (tokens); got "
                             f"{tuple(out_scale.shape)}")


def launch(ctx, partial, residual, weight, eps: float, group, async_op: bool, out, out_scale=None) -> list:
    """Check, then launch the kernel (see the module); returns its launches, bound (:mod:`iris.host.replay`)."""
    _check(ctx, partial, residual, weight, out, out_scale)
    quantize = out_scale is not None
    members = ctx.team.participants(group)  # checks membership too, before any launch
    tokens, hidden = partial.shape
    return _common.run(ctx, group, async_op, True, _all_reduce_rmsnorm_kernel, tokens, partial, residual, weight,
                       out, out_scale if quantize else out, float(torch.finfo(out.dtype).max) if quantize else 1.0,
                       tokens, hidden, float(eps), members.tensor, members.size, members.index, ctx.get_rank(),
                       ctx.get_heap_bases(), BLOCK_H=triton.next_power_of_2(hidden), QUANTIZE=quantize)


def all_reduce_rmsnorm(partial, residual, weight, ctx, eps: float = 1e-6, group=None, async_op: bool = False,
                       config=None, out=None, out_scale=None):
    """``residual += sum over members of partial``; returns ``rmsnorm(residual) * weight`` (see the module).

    ``partial`` (tokens, hidden) on the heap, ``residual`` updated in place, ``weight`` (hidden,); ``eps`` added
    to the mean square; ``async_op`` leaves out the closing barrier; ``config`` accepted, unused; ``out`` (None:
    a new tensor) may be float8 e4m3 with ``out_scale``, (tokens,) float32, receiving each row's scale.

    Example:
        >>> out = all_reduce_rmsnorm(partial, residual, weight, ctx)   # or ctx.ccl.all_reduce_rmsnorm(...)
    """
    return ctx.ccl.all_reduce_rmsnorm(partial, residual, weight, eps=eps, group=group, async_op=async_op,
                                      config=config, out=out, out_scale=out_scale)
