"""all_gather_matmul by the vendor's GEMM (``FusedConfig(vendor_gemm=True)``): copies gather, torch multiplies.

Why: where the GEMM dominates, the vendor's library beats Iris's tile loop; this keeps the overlap. After an
entry barrier, copies on a side stream send A_shard to every member's slot and set its flag while torch
multiplies the own slice; then, per member in arrival order, a one-program kernel waits for its flag and torch
adds ``slot @ B[its rows]``. Each product is rounded to output's dtype, so output must have A's dtype.

Example:
    >>> ctx.ops.all_gather_matmul(out, A_shard, B, config=FusedConfig(vendor_gemm=True))
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from iris.device import tracing
from iris.device.rma import HEAP_BASES_SLOT
from iris.device.sync import wait_until
from iris.device.tracing import tracing_from_context
from iris.host.replay import bind, weakly_held
from iris.ops import _fused

WHAT = "all_gather_matmul"


@triton.jit
def _arrival_kernel(flags, position, sender, cur, heap_bases, WORLD: tl.constexpr, TRACE: tl.constexpr):
    """Wait until member ``position``'s slice has come; traced as a wait on its sender."""
    trace = tracing_from_context(heap_bases - HEAP_BASES_SLOT, WORLD, TRACE)  # records nothing unless TRACE
    waiting = trace.start(tracing.WAIT, cur, sender, flags + position, position, 0, 0)
    wait_until(flags + position, "!=", 0)
    trace.end(waiting)


def problem(ctx, A_shard) -> tuple:
    """(key, spec) of a call's workspace: every member's slot and arrival flag."""
    world = ctx.get_num_ranks()
    M, K_r = A_shard.shape
    key = (WHAT, "vendor_gemm", M, K_r, A_shard.dtype)
    spec = {"gathered": _fused.Buffer(world * M * K_r, A_shard.dtype, heap=True),
            "flags": _fused.Buffer(world, torch.int64, heap=True, zeroed=True)}
    return key, spec


def _own_product(A_shard, B, output, bias, first: int, rows: int) -> None:
    if bias is None:
        torch.mm(A_shard, B[first:first + rows], out=output)
    else:
        torch.addmm(bias.to(output.dtype), A_shard, B[first:first + rows], out=output)


def _added_product(B, output, slot, first: int, rows: int) -> None:
    output.addmm_(slot, B[first:first + rows])


def launches(ctx, output, A_shard, B, bias, workspace) -> list:
    """The call's launches, in order and not yet launched, holding the caller's tensors weakly."""
    members = ctx.team.participants(None)
    M, K_r = A_shard.shape
    slots = workspace.gathered.view(members.size, M, K_r)
    own = weakly_held(functools.partial(_own_product, first=members.index * K_r, rows=K_r), A_shard, B, output,
                      bias)
    added = []
    for step in range(1, members.size):  # member index - step sends to this one at its step: in that order
        position = (members.index - step) % members.size
        added += [bind(_arrival_kernel, (1,), workspace.flags, position, members.ranks[position], ctx.get_rank(),
                       ctx.get_heap_bases(), WORLD=ctx.get_num_ranks(), TRACE=ctx.tracing.enabled),
                  weakly_held(functools.partial(_added_product, slot=slots[position], first=position * K_r, rows=K_r),
                              B, output)]
    send, finish = _fused.sent_by_copies(ctx, A_shard, workspace.gathered, workspace.flags)
    return [ctx.team.barrier.launch(None), send, own, *added, finish]
