"""iris.x's KV-cache exchange (send_kv, wait_kv, recv_kv), called for every (token block, head) tile of a user's
kernel and as the device context's methods, against torch's exchange of the same blocks: the same block to every
rank (context parallelism) and a block per destination (all-to-all), float32 and bfloat16, at 2 and 3 ranks. The
token blocks do not divide the tokens and the head is narrower than its tile (masked edges); the sources have padded
rows; the receive buffers, their guard rows and the flags are poisoned or checked in every element."""

import pytest
import torch
import triton
import triton.language as tl

import iris
import iris.x

TOKENS, HEADS, BT, BD = 12, 2, 8, 16  # 12 tokens a rank block: token blocks of 8, the last ragged
GUARD, PAD, POISON = 3, 5, -999.0  # rows past the receive buffer, columns past each source row, what fills both


@triton.jit(do_not_specialize=["call"])
def _exchange(k_src, v_src, k_dst, v_dst, flags, k_seen, v_seen, context, src_rows, src_stride, call,
              rank: tl.constexpr, world: tl.constexpr, T: tl.constexpr, HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
              BT: tl.constexpr, BD: tl.constexpr, METHOD: tl.constexpr):
    """Send this program's tile (token block, head) to every rank, then read every rank's same tile once arrived
    into ``k_seen`` / ``v_seen`` (shaped as the receive buffers). METHOD: the device context's methods, keys only
    (``v_*`` None), the head as wide as the tile (head_dim left out)."""
    ctx = iris.DeviceContext.initialize(context, rank, world)
    tile = iris.x.TileView(tl.program_id(0), tl.program_id(1), BT, BD)
    width = HEADS * HEAD_DIM
    ks = iris.x.make_tensor_view(k_src, src_rows, width, src_stride, 1)
    vs = iris.x.make_tensor_view(v_src, src_rows, width, src_stride, 1)
    kd = iris.x.make_tensor_view(k_dst, world * T, width, width, 1)
    vd = iris.x.make_tensor_view(v_dst, world * T, width, width, 1)
    t = tile.pid_m * BT + tl.arange(0, BT)
    d = tl.arange(0, BD)
    inside = (t < T)[:, None] & (d < HEAD_DIM)[None, :]
    if METHOD:
        ctx.send_kv(tile, ks, None, kd, None, flags, value=call)
    else:
        iris.x.send_kv(tile, ks, vs, kd, vd, flags, ctx, HEAD_DIM, call)
    for s in tl.static_range(world):
        at = (s * T + t)[:, None] * width + (tile.pid_n * HEAD_DIM + d)[None, :]
        if METHOD:
            ctx.wait_kv(tile, kd, flags, s, value=call)
            tl.store(k_seen + at, tl.load(k_dst + at, mask=inside), mask=inside)
        else:
            k, v = iris.x.recv_kv(tile, kd, vd, flags, s, ctx, HEAD_DIM, call)
            tl.store(k_seen + at, k, mask=inside)
            tl.store(v_seen + at, v, mask=inside)


def _exchanging(cases):
    """Each case (dtype, per_destination, method, head_dim), called twice (flag values 1 then 2, fresh data): the
    failures, by case and what went wrong."""
    ctx = iris.iris(1 << 22)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    g = torch.Generator().manual_seed(13)
    blocks = triton.cdiv(TOKENS, BT)
    failures = []
    for dtype_name, per_destination, method, head_dim in cases:
        dtype = getattr(torch, dtype_name)
        width = HEADS * head_dim
        rows = world * TOKENS if per_destination else TOKENS
        k_dst = ctx.full((world * TOKENS + GUARD, width), POISON, dtype=dtype)
        v_dst = ctx.full((world * TOKENS + GUARD, width), POISON, dtype=dtype)
        flags = ctx.zeros(world * blocks * HEADS + GUARD, dtype=torch.int32)
        for call in (1, 2):
            # every rank draws every rank's keys and values alike, so each knows what it should receive
            ks = [torch.randn(rows, width, generator=g).to(dtype) for _ in range(world)]
            vs = [torch.randn(rows, width, generator=g).to(dtype) for _ in range(world)]
            k_src = torch.full((rows, width + PAD), POISON, dtype=dtype, device=device)
            v_src = torch.full((rows, width + PAD), POISON, dtype=dtype, device=device)
            k_src[:, :width] = ks[rank].to(device)
            v_src[:, :width] = vs[rank].to(device)
            k_seen = torch.full((world * TOKENS, width), POISON, dtype=dtype, device=device)
            v_seen = torch.full((world * TOKENS, width), POISON, dtype=dtype, device=device)
            ctx.barrier()  # the peers are done reading the previous call's blocks
            _exchange[(blocks, HEADS)](k_src, v_src, k_dst, v_dst, flags, k_seen, v_seen, ctx.get_device_context(),
                                       rows, width + PAD, call, rank=rank, world=world, T=TOKENS, HEADS=HEADS,
                                       HEAD_DIM=head_dim, BT=BT, BD=BD, METHOD=method)
            ctx.device_barrier()
            ctx.barrier()
            # torch's exchange: rank s's block for this rank (rows [rank*T, (rank+1)*T) of a per-destination source)
            mine = slice(rank * TOKENS, (rank + 1) * TOKENS) if per_destination else slice(0, TOKENS)
            want_k = torch.cat([ks[s][mine] for s in range(world)])
            want_v = torch.cat([vs[s][mine] for s in range(world)])
            guard = torch.full((GUARD, width), POISON, dtype=dtype)
            case = (dtype_name, per_destination, method, head_dim, call)
            if not torch.equal(k_dst.cpu(), torch.cat([want_k, guard])):
                failures.append((case, "k received"))
            if not torch.equal(k_seen.cpu(), want_k):
                failures.append((case, "k read once arrived"))
            if method:  # keys only: the values' buffer is untouched
                if not bool((v_dst.cpu() == POISON).all()):
                    failures.append((case, "v written without v_src"))
            else:
                if not torch.equal(v_dst.cpu(), torch.cat([want_v, guard])):
                    failures.append((case, "v received"))
                if not torch.equal(v_seen.cpu(), want_v):
                    failures.append((case, "v read once arrived"))
            expected_flags = [call] * (world * blocks * HEADS) + [0] * GUARD
            if flags.cpu().tolist() != expected_flags:
                failures.append((case, "flags", flags.cpu().tolist()))
    ctx.close()
    return failures


# head_dim 12 in 16-wide tiles: every head's tile is masked past its 12 columns
FUNCTION_CASES = [("float32", True, False, 12), ("bfloat16", False, False, 12)]
OTHER_CASES = [("float32", False, False, 12), ("bfloat16", True, False, 12)]
METHOD_CASES = [("float32", True, True, BD), ("bfloat16", False, True, BD)]


def test_alltoall_kv_sends_every_tile_to_every_rank(ranks):
    for failures in ranks.run(_exchanging, FUNCTION_CASES):
        assert failures == []


@pytest.mark.slow  # each dtype and form is a kernel of its own to cross-compile: the default tier keeps two
def test_the_other_dtype_per_mode_and_the_device_context_exchanging_keys_alone(ranks):
    for failures in ranks.run(_exchanging, OTHER_CASES + METHOD_CASES):
        assert failures == []


def test_alltoall_kv_at_three_ranks(three_ranks):  # the slow tier's (conftest)
    for failures in three_ranks.run(_exchanging, FUNCTION_CASES + OTHER_CASES + METHOD_CASES):
        assert failures == []


def test_the_exchange_is_exported_with_its_method_forms():
    assert {"send_kv", "wait_kv", "recv_kv"} <= set(iris.x.__all__)
    for name in ("send_kv", "wait_kv", "recv_kv"):
        assert hasattr(iris.DeviceContext, name)


def _host_exchanges(calls):
    """ROCm/iris's host alltoall_kv, ``calls`` times with new chunks (a barrier between, as the buffers are reused):
    whether every rank's chunk was in its slot each time, and the flags after (all consumed: zeros)."""
    from iris.x.alltoall_kv import alltoall_kv

    ctx = iris.iris(1 << 22)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    chunk = 3 * 64 + 5  # blocks of 64, the last one ragged
    k_recv = ctx.full((world * chunk,), POISON, dtype=torch.float32)
    v_recv = ctx.full((world * chunk,), POISON, dtype=torch.bfloat16)
    flags = ctx.zeros(world, dtype=torch.int32)
    right = []
    for call in range(1, calls + 1):
        def chunks(source):
            g = torch.Generator().manual_seed(100 * call + source)
            return torch.randn(chunk, generator=g), torch.randn(chunk, generator=g).to(torch.bfloat16)

        k, v = (t.to(device) for t in chunks(rank))
        alltoall_kv(k, v, k_recv, v_recv, flags, ctx.get_device_context(), rank, world, BLOCK=64, num_fetch_sms=2)
        want = [chunks(source) for source in range(world)]
        right.append(torch.equal(k_recv.cpu(), torch.cat([w[0] for w in want]))
                     and torch.equal(v_recv.cpu(), torch.cat([w[1] for w in want])))
        ctx.barrier()  # every rank has read its buffers before anyone sends again
    zeros = flags.cpu().tolist()
    ctx.close()
    return right, zeros


def test_the_host_alltoall_kv_puts_every_ranks_chunk_in_its_slot_everywhere(ranks):
    """ROCm/iris's argument list (iris.x.alltoall_kv is its module); three calls on the same buffers and flags."""
    for right, flags in ranks.run(_host_exchanges, 3):
        assert right == [True] * 3 and flags == [0] * ranks.world_size, (right, flags)


def test_the_host_alltoall_kv_refuses_buffers_that_do_not_fit():
    from iris.x.alltoall_kv import alltoall_kv

    k = torch.zeros(8)
    with pytest.raises(ValueError, match="k_recv_buf must be contiguous with world_size \\* chunk = 16.*ready_flags"):
        alltoall_kv(k, k.clone(), torch.zeros(8), torch.zeros(16), torch.zeros(2), None, 0, 2)
