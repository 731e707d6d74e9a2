"""GEMM with the sum over ranks in the same kernel: ``matmul_all_reduce`` and ``matmul_reduce_scatter``.

The tensor-parallel row-split layer: each rank holds ``A`` (M, K_r) and ``B`` (K_r, N); the result is the sum
over ranks of ``A_r @ B_r`` (+ ``bias`` once). ``matmul_reduce_scatter`` gives rank r its N / W columns, or, given
a full (M, N) output, its run of ``block_size_m`` x ``block_size_n`` blocks and zeros elsewhere.

One persistent kernel per rank; program p of every rank computes the same tiles, so a program waits only for
its peers of the same id. Per tile it computes its partial, stores it into slot ``index`` of every owner of the
tile's columns, and one tile later (so the stores drain behind the next GEMM) counts it on their flags, waits
for every member's count and sums the slots in member order (every rank gets the same bits). Owner-reduce (by
default beyond 2 ranks) sends each partial only to the tile's owner, which sends back the sum: 2 (W - 1) / W
tiles of traffic per tile instead of W - 1. Across nodes, partials leave through an outbox as row transfers.
A barrier per program before the first store keeps slots safe; the output is complete when the kernel ends.

Other ways: ``pipeline_chunks`` (:mod:`~iris.ops.matmul_all_reduce.pipelined`), ``copy_engine``
(:mod:`~iris.ops.matmul_all_reduce.copy_engine`), and ``comm_programs``, where the last C programs only
communicate and wait only on lower program ids.

Example:
    >>> out = torch.empty(M, N, dtype=torch.bfloat16, device=ctx.get_device())
    >>> ctx.ops.matmul_all_reduce(out, A_shard, B_shard, bias=bias)
    >>> part = torch.empty(M, N // ctx.get_num_ranks(), dtype=torch.bfloat16, device=ctx.get_device())
    >>> ctx.ops.matmul_reduce_scatter(part, A_shard, B_shard)
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from iris.ccl.all_gather import store_to_members
from iris.device import rma, sync, tracing
from iris.device.barrier import GROUP_ARGS, enter
from iris.host.replay import bind
from iris.ops import _fused
from iris.ops.matmul_all_reduce import copy_engine, pipelined
from iris.ops.config import FusedConfig
from iris.ops.gemm import add_bias, operand, tile_count, tile_of, tile_product


@triton.jit
def _owned(position, N, width, SCATTER: tl.constexpr):
    """First column owned by the member at ``position`` and how many (all of them unless scattering)."""
    if SCATTER:
        return position * width, width
    return position * 0, N


@triton.jit
def _meets(tile_n, lo, width, BLOCK_N: tl.constexpr):
    return (tile_n * BLOCK_N < lo + width) & (tile_n * BLOCK_N + BLOCK_N > lo)


@triton.jit
def _owner(tile, programs, count):
    """The member position that reduces ``tile`` under owner-reduce, rotating so every rank owns its share."""
    return (tile % programs + tile // programs) % count


@triton.jit
def _in_run(rows, cols, position, count, run_m, run_n, runs_n, per_rank, RUNS: tl.constexpr):
    """Which elements of a tile the member at ``position`` owns in the block-run layout (``RUNS``; else all).

    Blocks are numbered row-major, ``per_rank`` to each member, the last member also taking the rest."""
    if RUNS:
        run = (rows[:, None] // run_m) * runs_n + cols[None, :] // run_n
        owner = tl.where(per_rank > 0, tl.minimum(run // tl.maximum(per_rank, 1), count - 1), count - 1)
        return owner == position
    return (rows[:, None] >= 0) & (cols[None, :] >= 0)


@triton.jit
def _receives(tile, tile_n, position, lo, own, programs, count, OWNER: tl.constexpr, BLOCK_N: tl.constexpr):
    """Whether the member at ``position`` (owning columns ``[lo, lo + own)``) gets partials of ``tile``."""
    meets = _meets(tile_n, lo, own, BLOCK_N)
    if OWNER:
        meets = meets & (position == _owner(tile, programs, count))
    return meets


@triton.jit
def _announce(tile, tiles_m, tiles_n, flags, N, width, members, count, index, cur, heap_bases, programs,
              SCATTER: tl.constexpr, OWNER: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Count ``tile`` on the flag of every other member that gets partials of it."""
    tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)[1]
    tl.debug_barrier()  # every thread's stores of the tile before the flags
    for i in range(1, count):
        position = (index + i) % count
        lo, own = _owned(position, N, width, SCATTER)
        if _receives(tile, tile_n, position, lo, own, programs, count, OWNER, BLOCK_N):
            sync.signal(flags + tile, 1, cur, tl.load(members + position), heap_bases, op="add")


@triton.jit
def _finish(tile, tiles_m, tiles_n, out, bias, partials, flags, seen, M, N, width, stride_om, stride_on, members,
            count, index, cur, heap_bases, programs, runs, SCATTER: tl.constexpr, OWNER: tl.constexpr,
            RUNS: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
            GROUP_M: tl.constexpr):
    """If this rank gets partials of ``tile``: wait for every member's slot, sum in member order, write.

    Under owner-reduce the owner also publishes the sum for :func:`_collect`."""
    tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
    lo, own = _owned(index, N, width, SCATTER)
    if _receives(tile, tile_n, index, lo, own, programs, count, OWNER, BLOCK_N):
        want = tl.load(seen + tile) + count - 1
        sync.wait_until(flags + tile, ">=", want)
        tl.store(seen + tile, want)
        tl.debug_barrier()  # the acquire before any thread reads the slots
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] >= lo) & (cols[None, :] < lo + own)
        mine = _in_run(rows, cols, index, count, runs[0], runs[1], runs[2], runs[3], RUNS)
        place = rows[:, None].to(tl.int64) * own + (cols[None, :] - lo)
        slot = tl.cast(M, tl.int64) * own
        total = tl.load(partials + place, mask=mask & mine, volatile=True).to(tl.float32)
        for j in range(1, count):
            total += tl.load(partials + j * slot + place, mask=mask & mine, volatile=True).to(tl.float32)
        total = add_bias(total, bias, cols, N, HAS_BIAS)
        if RUNS:
            total = tl.where(mine, total, 0.0)
        tl.store(out + rows[:, None].to(tl.int64) * stride_om + (cols[None, :] - lo) * stride_on,
                 total.to(out.dtype.element_ty), mask=mask)
        if OWNER:  # every member reads the owner's sum, so all get the same bits
            if rma.ENGINE:  # across nodes, block puts: the reads would not be blocks
                store_to_members(partials + index * slot + place, total.to(partials.dtype.element_ty), members,
                                 count, index, cur, heap_bases, mask, 1)
            else:
                tl.store(partials + index * slot + place, total.to(partials.dtype.element_ty), mask=mask)
            tl.debug_barrier()  # every thread's stores before the flags
            for i in range(1, count):
                sync.signal(flags + tile, 1, cur, tl.load(members + (index + i) % count), heap_bases, op="add")


@triton.jit
def _collect(tile, tiles_m, tiles_n, out, partials, flags, seen, M, N, stride_om, stride_on, members, count, index,
             cur, heap_bases, programs, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Owner-reduce, a tile this rank does not own: wait for its owner's sum and read it into the output."""
    owner = _owner(tile, programs, count)
    if owner != index:
        want = tl.load(seen + tile) + 1
        sync.wait_until(flags + tile, ">=", want)
        tl.store(seen + tile, want)
        tl.debug_barrier()  # the acquire before any thread reads the slot
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        place = owner * (tl.cast(M, tl.int64) * N) + rows[:, None].to(tl.int64) * N + cols[None, :]
        if rma.ENGINE:  # the owner stored it here
            total = tl.load(partials + place, mask=mask, volatile=True)
        else:
            total = rma.load(partials + place, cur, tl.load(members + owner), heap_bases, mask=mask, volatile=True)
        tl.store(out + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on,
                 total.to(out.dtype.element_ty), mask=mask)


@triton.jit
def _push(part, tile, rows, cols, tile_n, partials, outbox, M, N, width, members, count, index, cur, heap_bases,
          programs, runs, SCATTER: tl.constexpr, OWNER: tl.constexpr, RUNS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Store this rank's partial tile into slot ``index`` of every member that gets partials of it.

    With the engine path it goes through the ``outbox``: one block transfer per row, not one per element."""
    mine = outbox + rows[:, None].to(tl.int64) * N + cols[None, :]  # the tile in the outbox
    if rma.ENGINE:
        tl.store(mine, part, mask=(rows[:, None] < M) & (cols[None, :] < N))
    for i in range(0, count):  # start at a different member on every rank
        position = (index + i) % count
        lo, own = _owned(position, N, width, SCATTER)
        if _receives(tile, tile_n, position, lo, own, programs, count, OWNER, BLOCK_N):
            mask = (rows[:, None] < M) & (cols[None, :] >= lo) & (cols[None, :] < lo + own)
            mask = mask & _in_run(rows, cols, position, count, runs[0], runs[1], runs[2], runs[3], RUNS)
            place = index * (tl.cast(M, tl.int64) * own) + rows[:, None].to(tl.int64) * own + (cols[None, :] - lo)
            if rma.ENGINE:
                rma.put(mine, partials + place, cur, tl.load(members + position), heap_bases, mask=mask)
            else:
                rma.store(partials + place, part, cur, tl.load(members + position), heap_bases, mask=mask)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _matmul_reduce_kernel(a, b, out, bias, partials, outbox, flags, seen, stage, ready, calls, M, N, K, width,
                          stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on, members, count, index, cur,
                          heap_bases, arrivals, expected, run_m, run_n, runs_n, per_rank, SCATTER: tl.constexpr,
                          OWNER: tl.constexpr, RUNS: tl.constexpr,
                          TRACE: tl.constexpr, TMA: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
                          WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, COMM_PROGRAMS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n
    runs = (run_m, run_n, runs_n, per_rank)
    pid = tl.program_id(0)
    compute = tl.num_programs(0) - COMM_PROGRAMS  # programs that compute tiles; the rest communicate
    a_tiles = operand(a, M, K, stride_am, TMA, BLOCK_M, BLOCK_K)
    b_tiles = operand(b, K, N, stride_bk, TMA, BLOCK_K, BLOCK_N)
    if pid < compute:
        if COMM_PROGRAMS > 0:  # compute only: stage each tile locally and raise its flag for the communicators
            epoch = tl.load(calls) + 1
            for tile in range(pid, tiles, compute):
                tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
                acc, rows, cols = tile_product(a_tiles, b_tiles, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                               tile_m, tile_n, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
                tl.store(stage + rows[:, None].to(tl.int64) * N + cols[None, :], acc.to(stage.dtype.element_ty),
                         mask=(rows[:, None] < M) & (cols[None, :] < N))
                tl.debug_barrier()  # every thread's stores of the tile before its flag
                tl.atomic_xchg(ready + tile, epoch, sem="release", scope="gpu")
        else:  # compute and communicate: push each tile, count and sum it one tile later (collect two later)
            trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, True, BARRIER_BLOCK, TRACE)
            previous = -1
            older = -1
            for tile in range(pid, tiles, compute):
                tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
                span = trace.start(tracing.COMPUTE, cur, cur, out, tile_m, tile_n, 0)
                acc, rows, cols = tile_product(a_tiles, b_tiles, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                                               tile_m, tile_n, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
                trace.end(span)
                if previous >= 0:
                    _announce(previous, tiles_m, tiles_n, flags, N, width, members, count, index, cur, heap_bases,
                              compute, SCATTER, OWNER, BLOCK_N, GROUP_M)
                span = trace.start(tracing.PUT, cur, cur, partials, tile_m, tile_n,
                                   BLOCK_M * BLOCK_N * (partials.dtype.element_ty.primitive_bitwidth // 8))
                _push(acc.to(partials.dtype.element_ty), tile, rows, cols, tile_n, partials, outbox, M, N, width,
                      members, count, index, cur, heap_bases, compute, runs, SCATTER, OWNER, RUNS, BLOCK_N)
                trace.end(span)
                if previous >= 0:
                    span = trace.start(tracing.REDUCE, cur, cur, flags + previous, -1, -1, 0)
                    _finish(previous, tiles_m, tiles_n, out, bias, partials, flags, seen, M, N, width, stride_om,
                            stride_on, members, count, index, cur, heap_bases, compute, runs, SCATTER, OWNER, RUNS,
                            HAS_BIAS, BLOCK_M, BLOCK_N, GROUP_M)
                    trace.end(span)
                if OWNER:
                    if older >= 0:
                        span = trace.start(tracing.WAIT, cur, cur, flags + older, -1, -1, 0)
                        _collect(older, tiles_m, tiles_n, out, partials, flags, seen, M, N, stride_om, stride_on,
                                 members, count, index, cur, heap_bases, compute, BLOCK_M, BLOCK_N, GROUP_M)
                        trace.end(span)
                    older = previous
                previous = tile
            if previous >= 0:
                _announce(previous, tiles_m, tiles_n, flags, N, width, members, count, index, cur, heap_bases,
                          compute, SCATTER, OWNER, BLOCK_N, GROUP_M)
                span = trace.start(tracing.REDUCE, cur, cur, flags + previous, -1, -1, 0)
                _finish(previous, tiles_m, tiles_n, out, bias, partials, flags, seen, M, N, width, stride_om,
                        stride_on, members, count, index, cur, heap_bases, compute, runs, SCATTER, OWNER, RUNS,
                        HAS_BIAS, BLOCK_M, BLOCK_N, GROUP_M)
                trace.end(span)
            if OWNER:
                span = trace.start(tracing.WAIT, cur, cur, flags, -1, -1, 0)
                if older >= 0:
                    _collect(older, tiles_m, tiles_n, out, partials, flags, seen, M, N, stride_om, stride_on, members,
                             count, index, cur, heap_bases, compute, BLOCK_M, BLOCK_N, GROUP_M)
                if previous >= 0:
                    _collect(previous, tiles_m, tiles_n, out, partials, flags, seen, M, N, stride_om, stride_on,
                             members, count, index, cur, heap_bases, compute, BLOCK_M, BLOCK_N, GROUP_M)
                trace.end(span)
    else:  # communicate only (workgroup specialization): wait for staged tiles, push, count and sum them
        enter(arrivals, expected, members, count, cur, heap_bases, WORLD, True, BARRIER_BLOCK, TRACE)
        epoch = tl.load(calls) + 1
        previous = -1
        for tile in range(pid - compute, tiles, COMM_PROGRAMS):
            tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
            rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
            sync.wait_until(ready + tile, "==", epoch, scope="gpu")
            tl.debug_barrier()  # the acquire before any thread reads the staged tile
            part = tl.load(stage + rows[:, None].to(tl.int64) * N + cols[None, :],
                           mask=(rows[:, None] < M) & (cols[None, :] < N))
            _push(part, tile, rows, cols, tile_n, partials, outbox, M, N, width, members, count, index, cur,
                  heap_bases, COMM_PROGRAMS, runs, SCATTER, False, RUNS, BLOCK_N)
            _announce(tile, tiles_m, tiles_n, flags, N, width, members, count, index, cur, heap_bases, COMM_PROGRAMS,
                      SCATTER, False, BLOCK_N, GROUP_M)
            if previous >= 0:
                _finish(previous, tiles_m, tiles_n, out, bias, partials, flags, seen, M, N, width, stride_om,
                        stride_on, members, count, index, cur, heap_bases, COMM_PROGRAMS, runs, SCATTER, False, RUNS,
                        HAS_BIAS, BLOCK_M, BLOCK_N, GROUP_M)
            previous = tile
        if previous >= 0:
            _finish(previous, tiles_m, tiles_n, out, bias, partials, flags, seen, M, N, width, stride_om, stride_on,
                    members, count, index, cur, heap_bases, COMM_PROGRAMS, runs, SCATTER, False, RUNS, HAS_BIAS,
                    BLOCK_M, BLOCK_N, GROUP_M)


def in_runs(scatter: bool, output, A, B) -> bool:
    """Whether a reduce_scatter call asks for the block-run layout (an (M, N) output)."""
    shapes = [tuple(getattr(t, "shape", ())) for t in (output, A, B)]
    return scatter and len(shapes[1]) == len(shapes[2]) == 2 and shapes[0] == (shapes[1][0], shapes[2][1])


def problem(what: str, scatter: bool, ctx, output, A, B, config):
    """(key, spec) of one call, whichever way it goes (the pipeline, copies or the fused kernel)."""
    if not scatter and pipelined.chunks(ctx, config, A):
        return pipelined.problem(output, A, B)
    if sends_by_copies(ctx, config, A, B) and not in_runs(scatter, output, A, B):
        key, spec, _, _, _ = copy_engine.problem(ctx, output, A, B, config, gather=not scatter)
        return key, spec
    key, spec, _, _ = kernel_problem(what, scatter, ctx, output, A, B, config)
    return key, spec


def kernel_problem(what: str, scatter: bool, ctx, output, A, B, config):
    """(key, spec, width, tile) of one call by the fused kernel."""
    world = ctx.get_num_ranks()
    M, N = A.shape[0], B.shape[1]
    runs = in_runs(scatter, output, A, B)  # every member's slot holds whole tiles: this rank's elements of them
    width = N // world if scatter and not runs else N
    tile = _fused.tile(ctx, config, A.dtype, M, N)
    owner = reduces_at_owner(scatter, ctx, config)  # its flags count differently: a workspace of its own
    engine = bool(rma.ENGINE.value)  # the engine path compiled in (a shmem heap): the pushes need an outbox
    key = (what, M, N, output.dtype, tuple(tile.values()), config.comm_programs, owner, engine, runs)
    tiles = tile_count(M, N, tile)
    spec = {"partials": _fused.Buffer(world * M * width, output.dtype, heap=True),
            "flags": _fused.Buffer(tiles, torch.int64, heap=True, zeroed=True),
            "seen": _fused.Buffer(tiles, torch.int64, heap=False, zeroed=True)}  # tile counts seen so far
    if engine:  # each partial tile stored here, then put from here toward other nodes (see _push)
        spec["outbox"] = _fused.Buffer(M * N, output.dtype, heap=True)
    if config.comm_programs:  # the compute programs' staged tiles, their flags, and the call count
        spec.update(stage=_fused.Buffer(M * N, output.dtype, heap=False),
                    ready=_fused.Buffer(tiles, torch.int32, heap=False, zeroed=True),
                    calls=_fused.Buffer(1, torch.int64, heap=False, zeroed=True))
    return key, spec, width, tile


def _runs_of(ctx, config: FusedConfig, M: int, N: int) -> tuple[int, int, int, int]:
    """The block-run layout (:func:`_in_run`): its block height and width, blocks per row, blocks per rank."""
    run_m, run_n = config.block_size_m, config.block_size_n
    runs_n = -(-N // run_n)
    return run_m, run_n, runs_n, (-(-M // run_m) * runs_n) // ctx.get_num_ranks()


def sends_by_copies(ctx, config: FusedConfig, A, B) -> bool:
    """Whether this call sends its partials by copies (None: ``copy_engine.by_default``)."""
    if config.copy_engine is not None:
        return config.copy_engine
    return copy_engine.by_default(ctx, config, A, B)


def reduces_at_owner(scatter: bool, ctx, config: FusedConfig) -> bool:
    """Whether matmul_all_reduce runs owner-reduce (None: beyond 2 ranks; at 2, push-to-all is a hop shorter)."""
    if scatter or config.comm_programs:
        return False
    return ctx.get_num_ranks() > 2 if config.reduce_at_owner is None else config.reduce_at_owner


#: The all_reduce variants matmul_all_reduce takes (push, ll and hierarchical for the chunks of its pipeline).
MATMUL_ALL_REDUCE_VARIANTS = (None, "one_shot", "two_shot", "push", "ll", "hierarchical")


def _check(what, ctx, output, A, B, bias, scatter: bool, config: FusedConfig) -> None:
    world = ctx.get_num_ranks()
    if not scatter and config.all_reduce_variant not in MATMUL_ALL_REDUCE_VARIANTS:
        raise ValueError(f"{what}: matmul_all_reduce supports only all_reduce_variant None, 'one_shot' or 'two_shot' "
                         f"(and Iris's 'push', 'll', 'hierarchical' for its pipeline), got "
                         f"{config.all_reduce_variant!r}")
    if config.pipeline_chunks and config.copy_engine and not scatter:
        raise ValueError(f"{what}: FusedConfig(pipeline_chunks={config.pipeline_chunks} and copy_engine=True): the "
                         "chunks' sums go by iris.ccl.all_reduce, not by copies; pass one or the other")
    if config.copy_engine and in_runs(scatter, output, A, B):
        raise ValueError(f"{what}: FusedConfig(copy_engine=True) sends each rank its N / {world} columns, but an "
                         f"({A.shape[0]}, {B.shape[1]}) output asks for the block-run layout (each rank its run "
                         "of block_size_m x block_size_n blocks): pass an (M, N / W) output, or copy_engine=None")
    if config.copy_engine:  # asked for: refused aloud (None takes the pushes where copies cannot go)
        refusal = copy_engine.obstacle(ctx, config, B.shape[1])
        if refusal:
            raise ValueError(f"{what}: {refusal}")
    if config.vendor_gemm and not scatter:
        refusal = _fused.vendor_dtype_refusal(output, A) or pipelined.refusal(config)
        if refusal:
            raise ValueError(f"{what}: {refusal}")

    def output_shape(M, K, N):
        if in_runs(scatter, output, A, B):
            return (M, N)
        if scatter and N % world:
            raise ValueError(f"{what}: B has {N} columns, not divisible by the {world} ranks")
        return (M, N // world if scatter else N)

    _fused.check(what, ctx, output, A, B, bias, output_shape, symmetric_output=False)


def preamble(what: str, scatter: bool, ctx, output, A, B, config=None) -> _fused.Workspace:
    """Check the operands and make the workspace; collective (a heap allocation)."""
    config = FusedConfig() if config is None else config
    _check(what, ctx, output, A, B, None, scatter, config)
    return _fused.Workspace.allocate(ctx, *problem(what, scatter, ctx, output, A, B, config))


def run(what: str, scatter: bool, ctx, output, A, B, bias=None, config=None, workspace=None) -> tuple:
    """One checked call of ``what``: the workspace and its bound launches, not yet launched."""
    config = FusedConfig() if config is None else config
    _check(what, ctx, output, A, B, bias, scatter, config)
    M, N = A.shape[0], B.shape[1]
    runs = in_runs(scatter, output, A, B)
    count = 0 if scatter else pipelined.chunks(ctx, config, A)
    if count:
        return pipelined.run(ctx, output, A, B, bias, count, workspace, config.all_reduce_variant,
                             bool(config.vendor_gemm), config.pipeline_comm_sms)
    if sends_by_copies(ctx, config, A, B) and not runs:
        return copy_engine.run(ctx, output, A, B, bias, config, workspace, gather=not scatter)
    key, spec, width, tile = kernel_problem(what, scatter, ctx, output, A, B, config)
    workspace = _fused.workspace_for(ctx, what, key, spec, workspace)
    tiles = tile_count(M, N, tile)
    comm = config.comm_programs
    if comm:  # every program may wait only on lower ids of its own launch: the communicators come last
        compute = max(1, _fused.concurrent_programs(ctx) - comm)
        programs = min(compute, tiles) + comm
        stage, ready, calls = workspace.stage, workspace.ready, workspace.calls
    else:
        programs = _fused.launch_size(ctx, tiles)
        stage, ready, calls = workspace.partials, workspace.flags, workspace.seen  # unused
    launches = [bind(
        _matmul_reduce_kernel, (programs,),
        A, B, output, bias if bias is not None else output, workspace.partials,
        getattr(workspace, "outbox", workspace.partials), workspace.flags, workspace.seen,
        stage, ready, calls, M, N, A.shape[1], width, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
        output.stride(0), output.stride(1), *_fused.barrier_arguments(ctx), *_runs_of(ctx, config, M, N),
        SCATTER=scatter and not runs, OWNER=reduces_at_owner(scatter, ctx, config), RUNS=runs,
        TRACE=ctx.tracing.enabled, TMA=_fused.tma_loads(ctx, config, A, B), HAS_BIAS=bias is not None,
        UPCAST=ctx.team.backend.upcasts_narrow_floats, WORLD=ctx.get_num_ranks(), BARRIER_BLOCK=ctx.team.barrier.block,
        COMM_PROGRAMS=comm, **tile)]
    if comm:  # on the stream, after the launch: the next call's tiles carry the next epoch
        launches.append(functools.partial(calls.add_, 1))
    return workspace, launches
