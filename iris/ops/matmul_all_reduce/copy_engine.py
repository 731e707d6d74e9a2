"""``matmul_reduce_scatter`` and ``matmul_all_reduce`` with the partials sent by copies (``FusedConfig.copy_engine``).

Why: pushes from the computing programs take SM time; the copy engine takes none. ``send`` computes the
partials of every other member's columns into a local stage; copies on a side stream send them by row chunks,
each followed by its flag; meanwhile ``own`` computes this rank's columns and sums each tile in member order
as its flags arrive (the pushing kernel's bits); ``finish`` clears the flags and joins. With ``gather``
(matmul_all_reduce) the sums also go to every member. Needs one GPU per rank inside one node.

Example:
    >>> part = torch.empty(M, N // W, dtype=torch.bfloat16, device=ctx.get_device())
    >>> ctx.ops.matmul_reduce_scatter(part, A_shard, B_shard, config=FusedConfig(copy_engine=True))
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.ccl.all_gather import store_to_members
from iris.device import sync, tracing
from iris.device.barrier import GROUP_ARGS, enter
from iris.host.replay import bind
from iris.ops import _fused
from iris.ops.gemm import add_bias, operand, tile_count, tile_of, tile_product

CHUNKS = 8  # row chunks per member's block: the second launch's first tiles wait for the first chunk only
BY_DEFAULT_RANKS = 2  # the world size at which copy_engine=None takes the copies, where they win


@triton.jit(do_not_specialize=GROUP_ARGS)
def _send_kernel(a, b, stage, M, K, width, stride_am, stride_ak, stride_bk, stride_bn, members, count, index, cur,
                 heap_bases, arrivals, expected, TRACE: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr,
                 WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """Every other member's columns of this rank's partial, block ``position`` of ``stage`` ((M, width) each)."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, False, BARRIER_BLOCK, TRACE)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(width, BLOCK_N)
    tiles = tiles_m * tiles_n
    programs = tl.num_programs(0)
    a_tiles = operand(a, M, K, stride_am, TMA, BLOCK_M, BLOCK_K)
    for step in range(1, count):  # the next member's block first: its copies can start soonest
        position = (index + step) % count
        b_tiles = operand(b + position * width * stride_bn, K, width, stride_bk, TMA, BLOCK_K, BLOCK_N)
        block = stage + position * (tl.cast(M, tl.int64) * width)
        first = (tl.program_id(0) + (step - 1) * tiles) % programs  # each block's last wave on other programs
        for tile in range(first, tiles, programs):
            tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
            span = trace.start(tracing.COMPUTE, cur, cur, block, tile_m, tile_n, 0)
            acc, rows, cols = tile_product(a_tiles, b_tiles, M, width, K, stride_am, stride_ak, stride_bk, stride_bn,
                                           tile_m, tile_n, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
            tl.store(block + rows[:, None].to(tl.int64) * width + cols[None, :], acc.to(stage.dtype.element_ty),
                     mask=(rows[:, None] < M) & (cols[None, :] < width))
            trace.end(span)


@triton.jit(do_not_specialize=GROUP_ARGS)
def _own_kernel(a, b, out, out_all, bias, partials, sums, flags, M, N, K, width, chunk_rows, chunks, stride_am,
                stride_ak, stride_bk, stride_bn, stride_om, stride_on, members, count, index, cur, heap_bases, arrivals,
                expected, TRACE: tl.constexpr, TMA: tl.constexpr, UPCAST: tl.constexpr, HAS_BIAS: tl.constexpr,
                GATHER: tl.constexpr, WORLD: tl.constexpr, BARRIER_BLOCK: tl.constexpr, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """This rank's columns (``out``): its own partial plus every member's, as each chunk's flags arrive.

    ``GATHER``: each sum also goes to every other member, and the others' sums are read into ``out_all``."""
    trace = enter(arrivals, expected, members, count, cur, heap_bases, WORLD, False, BARRIER_BLOCK, TRACE)
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(width, BLOCK_N)
    lo = index * width  # the first column this rank owns
    a_tiles = operand(a, M, K, stride_am, TMA, BLOCK_M, BLOCK_K)
    b_tiles = operand(b + lo * stride_bn, K, width, stride_bk, TMA, BLOCK_K, BLOCK_N)
    slot = tl.cast(M, tl.int64) * width
    tiles = tiles_m * tiles_n
    for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        span = trace.start(tracing.COMPUTE, cur, cur, out, tile_m, tile_n, 0)
        acc, rows, cols = tile_product(a_tiles, b_tiles, M, width, K, stride_am, stride_ak, stride_bk, stride_bn,
                                       tile_m, tile_n, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, TMA)
        trace.end(span)
        chunk = (tile_m * BLOCK_M) // chunk_rows
        waiting = trace.start(tracing.WAIT, cur, cur, flags + chunk, tile_m, tile_n, 0)
        for step in range(1, count):
            sync.wait_until(flags + ((index + step) % count) * chunks + chunk, ">=", 1)
        tl.debug_barrier()  # the acquire before any thread reads the partials
        trace.end(waiting)
        span = trace.start(tracing.REDUCE, cur, cur, flags + chunk, tile_m, tile_n, 0)
        mask = (rows[:, None] < M) & (cols[None, :] < width)
        place = rows[:, None].to(tl.int64) * width + cols[None, :]
        mine = acc.to(partials.dtype.element_ty).to(tl.float32)
        total = tl.zeros_like(acc)
        for position in range(0, count):  # member order, as the pushing kernel sums
            if position == index:
                total += mine
            else:
                total += tl.load(partials + position * slot + place, mask=mask, volatile=True).to(tl.float32)
        total = add_bias(total, bias, lo + cols, N, HAS_BIAS)
        total = total.to(out.dtype.element_ty)
        tl.store(out + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on, total, mask=mask)
        trace.end(span)
        if GATHER:  # the sum to every other member, then its flag there
            span = trace.start(tracing.PUT, cur, cur, sums, tile_m, tile_n, 0)
            store_to_members(sums + index * slot + place, total, members, count, index, cur, heap_bases, mask, 1)
            tl.debug_barrier()  # every thread's stores of the tile before the flags
            for step in range(1, count):
                sync.signal(flags + count * chunks + index * tiles + tile, 1, cur,
                            tl.load(members + (index + step) % count), heap_bases)
            trace.end(span)
    if GATHER:  # the other members' sums of this program's tiles, into their columns
        for tile in range(tl.program_id(0), tiles, tl.num_programs(0)):
            tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
            rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
            mask = (rows[:, None] < M) & (cols[None, :] < width)
            place = rows[:, None].to(tl.int64) * width + cols[None, :]
            for step in range(1, count):
                position = (index + step) % count
                waiting = trace.start(tracing.WAIT, cur, cur, sums, tile_m, tile_n, 0)
                sync.wait_until(flags + count * chunks + position * tiles + tile, ">=", 1)
                tl.debug_barrier()  # the acquire before any thread reads the sum
                trace.end(waiting)
                total = tl.load(sums + position * slot + place, mask=mask, volatile=True)
                tl.store(out_all + rows[:, None].to(tl.int64) * stride_om + (position * width + cols[None, :])
                         * stride_on, total, mask=mask)


def problem(ctx, output, A, B, config, gather: bool = False):
    """(key, spec, tile, chunk_rows, chunks) of one call (``gather``: matmul_all_reduce's)."""
    world = ctx.get_num_ranks()
    M, N = A.shape[0], B.shape[1]
    width = N // world
    tile = _fused.tile(ctx, config, A.dtype, M, width)
    tiles_m = triton.cdiv(M, tile["BLOCK_M"])
    chunk_rows = triton.cdiv(tiles_m, min(CHUNKS, tiles_m)) * tile["BLOCK_M"]
    chunks = triton.cdiv(M, chunk_rows)
    what = "matmul_all_reduce" if gather else "matmul_reduce_scatter"
    key = (what, M, N, output.dtype, tuple(tile.values()), "copies", chunks)
    spec = {"partials": _fused.Buffer(world * M * width, output.dtype, heap=True),
            "stage": _fused.Buffer(world * M * width, output.dtype, heap=False),
            # the chunks' flags, then (gather) the sums' flags, one per member and tile
            "flags": _fused.Buffer(world * (chunks + (tile_count(M, width, tile) if gather else 0)), torch.int64,
                                   heap=True, zeroed=True)}
    if gather:  # every member's sums of its own columns
        spec["sums"] = _fused.Buffer(world * M * width, output.dtype, heap=True)
    return key, spec, tile, chunk_rows, chunks


def _transfers(ctx, stage, partials, flags, M, width, chunk_rows, chunks) -> list:
    """The copies of one call, chunk by chunk, member by member from the next one: each chunk's rows of this
    rank's block for a member into slot ``index`` of that member's partials, then that member's flag."""
    members = ctx.team.participants(None)
    size = stage.element_size()
    slot = M * width * size
    transfers = []
    for chunk in range(chunks):
        first, rows = chunk * chunk_rows, min(chunk_rows, M - chunk * chunk_rows)
        for step in range(1, members.size):
            position = (members.index + step) % members.size
            member = members.ranks[position]
            offset = first * width * size
            transfers += [(_fused.peer_address(ctx, partials, member, members.index * slot + offset),
                           stage.data_ptr() + position * slot + offset, rows * width * size),
                          _fused.flag_set(ctx, flags, member, members.index * chunks + chunk)]
    return transfers


def by_default(ctx, config, A, B) -> bool:
    """copy_engine None: copies at :data:`BY_DEFAULT_RANKS` ranks where a member's block has more than one wave
    of tiles (within one wave nothing hides the copies) and nothing stands in the way."""
    if ctx.get_num_ranks() != BY_DEFAULT_RANKS:
        return False
    M, N = A.shape[0], B.shape[1]
    width = N // ctx.get_num_ranks()
    waves = tile_count(M, width, _fused.tile(ctx, config, A.dtype, M, width)) / _fused.concurrent_programs(ctx)
    return waves > 1 and obstacle(ctx, config, N) is None


def obstacle(ctx, config, N: int) -> str | None:
    """Why this job cannot send the partials of an output of ``N`` columns by copies, or None."""
    if N % ctx.get_num_ranks():
        return (f"FusedConfig(copy_engine=True) gives each member N / W columns to sum: B has {N} columns, not "
                f"divisible by the {ctx.get_num_ranks()} ranks; use copy_engine=False")
    if config.comm_programs:
        return (f"FusedConfig(copy_engine=True and comm_programs={config.comm_programs}): the partials go by "
                "copies or by communication programs; pass one or the other")
    if config.reduce_at_owner:
        return ("FusedConfig(copy_engine=True and reduce_at_owner=True): with copies each member sums its own "
                "columns; pass one or the other")
    return _fused.copy_refusal(ctx)


def run(ctx, output, A, B, bias, config, workspace, gather: bool = False) -> tuple:
    """One checked call: the workspace and the bound launches (barrier, send, copies, own, finish)."""
    M, K = A.shape
    N = B.shape[1]
    world = ctx.get_num_ranks()
    width = N // world
    key, spec, tile, chunk_rows, chunks = problem(ctx, output, A, B, config, gather)
    workspace = _fused.workspace_for(ctx, "matmul_all_reduce" if gather else "matmul_reduce_scatter", key, spec,
                                     workspace)
    index = ctx.team.participants(None).index
    own_columns = output[:, index * width:(index + 1) * width] if gather else output
    # descriptor loads where a member's first column of B is 16-byte aligned too
    tma = _fused.tma_loads(ctx, config, A, B) and (width * B.element_size()) % 16 == 0
    common = dict(TRACE=ctx.tracing.enabled, TMA=tma, UPCAST=ctx.team.backend.upcasts_narrow_floats, WORLD=world,
                  BARRIER_BLOCK=ctx.team.barrier.block, **tile)
    tiles = tile_count(M, width, tile)
    send = bind(_send_kernel, (_fused.launch_size(ctx, tiles * (world - 1)),), A, B, workspace.stage,
                M, K, width, A.stride(0), A.stride(1), B.stride(0), B.stride(1), *_fused.barrier_arguments(ctx),
                **common)
    own = bind(_own_kernel, (_fused.launch_size(ctx, tiles),), A, B, own_columns, output,
               bias if bias is not None else output, workspace.partials, getattr(workspace, "sums", workspace.partials),
               workspace.flags, M, N, K, width, chunk_rows, chunks, A.stride(0), A.stride(1), B.stride(0), B.stride(1),
               output.stride(0), output.stride(1), *_fused.barrier_arguments(ctx), HAS_BIAS=bias is not None,
               GATHER=gather, **common)
    copies, finish = _fused.copied(ctx, _transfers(ctx, workspace.stage, workspace.partials, workspace.flags, M,
                                                   width, chunk_rows, chunks), workspace.flags, A.device)
    return workspace, [ctx.team.barrier.launch(None), send, copies, own, finish]
