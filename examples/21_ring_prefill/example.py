"""Ring flash-prefill (context parallelism): the sequence split across ranks, the KV blocks passed around a ring.

Rank r holds the queries, keys and values of tokens [r*S, (r+1)*S) of every sequence (B x H x S x D, S = the
tokens / W). Its output is attention of its queries over the whole sequence, causal by default (rank r's queries
see KV blocks 0..r, the diagonal one masked within) or full (``--no-causal``). One kernel does a call: in step t
(0..W-1) rank r holds the KV block that started on rank r - t, runs attention on it with an online softmax
(running maximum, sum of exponentials, unnormalized output, as in example 19) and sends it on to rank r + 1 through
the symmetric heap. After its last step every rank has its output; no collective is launched. Under causal
masking a block travels only as far as it is needed (to rank W - 1, never around to rank 0), so rank r runs r + 1
steps: the ranks' work is unequal, as in every causal ring without a zig-zag layout.

The kernel and why it is safe:

* Programs. A tile is (batch*head, block of BLOCK_M queries); a unit of forwarding is the same rows of that head's
  K and V. Programs take tiles and units round-robin, and every program walks the steps in order (units first,
  then tiles), keeping each tile's running (max, sum, output) in a float32 scratch between steps. The grid is the
  device's: one program per SM of this rank's share of its GPU, all resident at once; one program where the
  backend runs a launch's programs in turn (the CPU interpreter). No program ever waits on another program of
  its own rank: it waits only on the previous rank (arrivals) and the next rank (acknowledgements).
* Slots. Each rank's heap has two slots for an incoming KV block. Arrivals are numbered over all calls,
  a = call * (W - 1) + t for the block that arrives for step t + 1, and arrival a lands in slot a % 2.
* Arrivals. A sender copies a unit into the receiver's slot, then sets that unit's flag there to a + 1 (a block
  barrier, then a release at system scope). A receiver reads a head's block only once every unit flag of that
  head holds at least a + 1 (acquire), and forwards a unit only once its flag does.
* Acknowledgements. Each program has a ``done`` word on its rank's heap: after step t >= 1 (every read of that
  step's slot finished: a block barrier, then a release) it holds the arrival it finished plus one, and at the
  end of a call (call + 1) * (W - 1) (steps a causal rank skips included). Before writing arrival a into the
  next rank's slot a % 2, a sender waits until every ``done`` word there is at least a - 1: the slot's previous
  arrival, a - 2, is finished by every program that reads it (its tiles and its forwarders). So no slot is
  overwritten while a slower peer still reads it, whichever rank runs ahead and by how much, across calls too.
  A stale flag never passes for a new arrival: flags only grow, and slot a % 2's flag reaches a + 1 only with
  arrival a. Nothing is reset between calls.
* Progress. Step t of a rank waits only on step t - 1 of its neighbours (the block it reads was sent in the
  previous rank's step t - 1; the slot it writes was last read in the next rank's step t - 1), so by induction
  on the step every program finishes, given that all programs of a launch are resident: on a GPU the grid is
  sized to fit (``--programs`` overrides it; nothing else may hold the SMs meanwhile); on the CPU it is one.
* Why not one program per tile, its running state in registers through all steps: with two slots, a head's
  third arrival may overwrite its first only once every tile of that head on the receiver is done with the
  first, yet the receiver's first tile needs the third arrival before its later tiles (higher program ids)
  have started where programs run in turn. That cycle hangs the CPU interpreter, and a GPU whenever a head's
  tiles are not resident together; steps in the outer loop, the state in scratch, break it.

The torch way beside it (``--benchmark``): all_gather of K and V (NCCL through torch.distributed where ranks have
GPUs of their own, else Iris's), then torch's scaled_dot_product_attention of this rank's queries with the
lower-right causal mask (keys up to this rank's block).

    iris run -n 2 examples/21_ring_prefill/example.py --validate
    iris run -n 4 examples/21_ring_prefill/example.py --validate --benchmark --no-causal
"""

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from torch.nn.attention.bias import causal_lower_right

import iris

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402

LOG2E = 1.4426950408889634


@triton.jit
def _wait_all(flags, mask, value, peer, ctx):
    """Spin until every word of ``peer``'s ``flags`` under ``mask`` is at least ``value`` (acquire, system scope)."""
    # the loop carries the scalar least value seen: Triton 3.8's layout pass crashed carrying the vector itself
    least = tl.min(tl.where(mask, ctx.atomic_add(flags, 0, peer, mask=mask, sem="acquire", scope="sys"), value), axis=0)
    while least < value:
        least = tl.min(tl.where(mask, ctx.atomic_add(flags, 0, peer, mask=mask, sem="acquire", scope="sys"), value),
                       axis=0)
    tl.debug_barrier()  # the acquire before any thread reads what the flags guard


@triton.jit(do_not_specialize=["BH", "call"])  # call: a new number each call, one compiled kernel for all
def ring_prefill(q, k, v, slot_k, slot_v, arrived, done, scratch, stats, out, context, BH, S, qk_scale, call,
                 RANK: tl.constexpr, WORLD: tl.constexpr, STEPS: tl.constexpr, SENDS: tl.constexpr,
                 CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 PROGRAMS: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_Q: tl.constexpr, UPCAST: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, RANK, WORLD)
    NEXT: tl.constexpr = (RANK + 1) % WORLD
    pid = tl.program_id(0)
    blocks = tl.cdiv(S, BLOCK_M)  # query blocks (and forwarding units) per head
    tiles = BH * blocks
    block = BH.to(tl.int64) * S * D  # elements of one KV block (K or V): a slot
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    unit_flags = tl.arange(0, BLOCK_Q)
    programs = tl.arange(0, BLOCK_G)
    first = call * (WORLD - 1)  # this call's first arrival number
    for t in range(STEPS):
        arrival_in = first + t - 1  # what is in hand at step t >= 1 (step 0: this rank's own block)
        arrival_out = first + t  # what this rank sends in step t
        if t == 0:
            hand_k = k
            hand_v = v
        else:
            hand_k = slot_k + (arrival_in % 2) * block
            hand_v = slot_v + (arrival_in % 2) * block
        in_flags = arrived + (arrival_in % 2) * tiles
        # 1. forward this program's units of the block in hand into the next rank's slot
        if t < SENDS:
            # that slot last held arrival_out - 2: wait until every program there has finished with it
            _wait_all(done + programs, programs < PROGRAMS, arrival_out - 1, NEXT, ctx)
            out_slot = (arrival_out % 2) * block
            for unit in range(pid, tiles, PROGRAMS):
                if t > 0:
                    ctx.wait_until(in_flags + unit, ">=", arrival_in + 1)
                head = unit // blocks
                r = (unit % blocks) * BLOCK_M + rows
                offsets = head.to(tl.int64) * S * D + r[:, None] * D + d[None, :]
                inside = r[:, None] < S
                ctx.store(slot_k + out_slot + offsets, tl.load(hand_k + offsets, mask=inside), NEXT, mask=inside)
                ctx.store(slot_v + out_slot + offsets, tl.load(hand_v + offsets, mask=inside), NEXT, mask=inside)
                ctx.signal(arrived + (arrival_out % 2) * tiles + unit, arrival_out + 1, NEXT)
        # 2. attention of this program's tiles over the block in hand
        for tile in range(pid, tiles, PROGRAMS):
            head = tile // blocks
            query_block = tile % blocks
            if t > 0:  # every unit of this head's block arrived
                _wait_all(in_flags + head * blocks + unit_flags, unit_flags < blocks, arrival_in + 1, RANK, ctx)
            r = query_block * BLOCK_M + rows
            head_base = head.to(tl.int64) * S * D
            query = tl.load(q + head_base + r[:, None] * D + d[None, :], mask=r[:, None] < S, other=0.0)
            if UPCAST:
                query = query.to(tl.float32)
            row_stats = stats + head.to(tl.int64) * S * 2 + r * 2
            tile_acc = scratch + head_base + r[:, None] * D + d[None, :]
            resume = (r < S) & (t > 0)  # step 0 starts afresh: no key seen, nothing summed
            m = tl.load(row_stats, mask=resume, other=float("-inf"))
            total = tl.load(row_stats + 1, mask=resume, other=0.0)
            acc = tl.load(tile_acc, mask=resume[:, None], other=0.0)
            end = S
            if CAUSAL:
                if t == 0:  # the diagonal block: keys up to the last query of this tile
                    end = tl.minimum((query_block + 1) * BLOCK_M, S)
            for start in range(0, end, BLOCK_N):
                c = start + cols
                keys = tl.load(hand_k + head_base + c[None, :] * D + d[:, None], mask=c[None, :] < S, other=0.0)
                values = tl.load(hand_v + head_base + c[:, None] * D + d[None, :], mask=c[:, None] < S, other=0.0)
                if UPCAST:
                    keys = keys.to(tl.float32)
                    values = values.to(tl.float32)
                if query.dtype == tl.float32:  # exact float32 products, not TF32
                    scores = tl.dot(query, keys, input_precision="ieee") * qk_scale
                else:
                    scores = tl.dot(query, keys) * qk_scale
                seen = c[None, :] < S
                if CAUSAL:
                    seen = seen & ((c[None, :] <= r[:, None]) | (t > 0))
                scores = tl.where(seen, scores, float("-inf"))
                m_new = tl.maximum(m, tl.max(scores, axis=1))
                shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet stays at zero
                weights = tl.exp2(scores - shift[:, None])
                rescale = tl.exp2(m - shift)
                total = total * rescale + tl.sum(weights, axis=1)
                if values.dtype == tl.float32:
                    acc = acc * rescale[:, None] + tl.dot(weights, values, input_precision="ieee")
                else:
                    acc = acc * rescale[:, None] + tl.dot(weights.to(values.dtype), values)
                m = m_new
            if t == STEPS - 1:
                tl.store(out + head_base + r[:, None] * D + d[None, :], (acc / total[:, None]).to(out.dtype.element_ty),
                         mask=r[:, None] < S)
            else:
                tl.store(row_stats, m, mask=r < S)
                tl.store(row_stats + 1, total, mask=r < S)
                tl.store(tile_acc, acc, mask=r[:, None] < S)
        if t > 0:  # this program is done with arrival_in: the previous rank may refill its slot
            ctx.signal(done + pid, arrival_in + 1, RANK)
    if STEPS < WORLD:  # the arrivals a causal rank skips: nothing of this call is read any more
        ctx.signal(done + pid, first + WORLD - 1, RANK)


def reference(q, whole_k, whole_v, rank, scale, causal):
    """Attention of this rank's queries (B, H, S, D) over the whole sequence's keys, in float64 on q's device,
    a slice of queries at a time; (B, H, S, D)."""
    B, H, S, D = q.shape
    keys_end = (rank + 1) * S if causal else whole_k.shape[2]
    want = torch.empty(B, H, S, D, dtype=torch.float64, device=q.device)
    step = max(1, (1 << 26) // keys_end)  # float64 scores of this many queries at once: 512 MiB at most
    for b in range(B):
        for h in range(H):
            keys = whole_k[b, h, :keys_end].to(q.device, torch.float64)
            values = whole_v[b, h, :keys_end].to(q.device, torch.float64)
            for i in range(0, S, step):
                scores = q[b, h, i:i + step].double() @ keys.T * scale
                if causal:  # query rank*S + i sees keys 0..rank*S + i
                    position = rank * S + torch.arange(i, min(i + step, S), device=q.device)
                    scores.masked_fill_(torch.arange(keys_end, device=q.device)[None, :] > position[:, None],
                                        float("-inf"))
                want[b, h, i:i + step] = torch.softmax(scores, dim=-1) @ values
    return want


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cpu = utils.on_cpu()
    parser.add_argument("--batch", type=int, default=1, help="sequences")
    parser.add_argument("--heads", type=int, default=2 if cpu else 32, help="attention heads")
    parser.add_argument("--head-dim", type=int, default=16 if cpu else 128, help="D, a power of two, 16 or more")
    parser.add_argument("--context", type=int, default=96 if cpu else 32768, help="tokens of each sequence, all ranks")
    parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True,
                        help="causal attention (--no-causal: every query sees every key)")
    parser.add_argument("--block-m", type=int, default=16 if cpu else 128, help="queries per tile")
    parser.add_argument("--block-n", type=int, default=16 if cpu else 64, help="keys per step of a tile's loop")
    parser.add_argument("--num-warps", type=int, default=4 if cpu else 8, help="warps per program on a GPU")
    utils.add_programs_arg(parser)
    utils.add_check_and_timing_args(parser, "the queries, keys, values and output", "the torch way", runs=20, warmup=5)
    return utils.add_common_args(parser).parse_args()


def _power_of_two(value: int) -> bool:
    return value > 0 and not value & (value - 1)


def main(args) -> int:
    dtype, B, H, D = utils.torch_dtype(args.datatype), args.batch, args.heads, args.head_dim
    for name, value in (("--head-dim", D), ("--block-m", args.block_m), ("--block-n", args.block_n)):
        if not _power_of_two(value) or value < 16:
            raise SystemExit(f"{name} {value}: a power of two, 16 or more (tl.dot's smallest tile)")
    sequence_bytes = B * H * args.context * D * dtype.itemsize  # K (or V) of the whole sequence, a bound per rank
    # two slots of K and V; for the torch way where there is no NCCL, Iris's all_gather of K (then V) and its input
    ctx = iris.iris(4 * sequence_bytes + (2 * sequence_bytes if args.benchmark else 0) + (1 << 24))
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    if args.context % world:
        raise SystemExit(f"--context {args.context}: a multiple of the {world} ranks")
    S, BH = args.context // world, B * H
    blocks = -(-S // args.block_m)
    tiles = BH * blocks
    programs = utils.resident_programs(ctx, args.programs, tiles)
    scale = 1.0 / math.sqrt(D)
    mine = slice(rank * S, (rank + 1) * S)
    whole = (B, H, args.context, D)
    whole_k, whole_v = utils.seeded(11, whole, dtype), utils.seeded(13, whole, dtype)
    q = utils.seeded(7, (B, H, args.context, D), dtype)[:, :, mine].contiguous().to(device)
    keys = whole_k[:, :, mine].contiguous().to(device)  # this rank's block of the sequence
    values = whole_v[:, :, mine].contiguous().to(device)
    slot_k = ctx.zeros(2, B, H, S, D, dtype=dtype)
    slot_v = ctx.zeros(2, B, H, S, D, dtype=dtype)
    arrived = ctx.zeros(2, tiles, dtype=torch.int32)
    block_g = max(2, triton.next_power_of_2(programs))
    done = ctx.zeros(block_g, dtype=torch.int32)
    scratch = torch.empty(B, H, S, D, dtype=torch.float32, device=device)
    stats = torch.empty(B, H, S, 2, dtype=torch.float32, device=device)
    out = torch.empty(B, H, S, D, dtype=dtype, device=device)
    steps = rank + 1 if args.causal else world
    sends = (rank + 1 if rank < world - 1 else 0) if args.causal else world - 1
    calls = [0]

    def fused():
        ring_prefill[(programs,)](q, keys, values, slot_k, slot_v, arrived, done, scratch, stats, out,
                                  ctx.get_device_context(), BH, S, scale * LOG2E, calls[0], RANK=rank, WORLD=world,
                                  STEPS=steps, SENDS=sends, CAUSAL=args.causal, D=D, BLOCK_M=args.block_m,
                                  BLOCK_N=args.block_n, PROGRAMS=programs, BLOCK_G=block_g,
                                  BLOCK_Q=max(2, triton.next_power_of_2(blocks)),
                                  UPCAST=ctx.backend.upcasts_narrow_floats, num_warps=args.num_warps)
        calls[0] += 1

    kind = "causal" if args.causal else "full"
    ok = True
    if args.validate:
        want = reference(q, whole_k, whole_v, rank, scale, args.causal)
        errors = []
        ctx.barrier()
        for _ in range(3):  # the slots alternate: later calls reuse them, never reset
            out.fill_(float("nan"))  # every element must be written again
            fused()  # no barrier between calls: a rank may run ahead into the next call's slots
            errors.append(((out.double() - want).norm() / want.norm()).item())
        ctx.barrier()
        error = max(errors)  # NaN (an element not written) fails the comparison below
        ok = utils.all_passed(ctx, error < (1e-5 if dtype == torch.float32 else 2e-2))
        ctx.log(f"ring prefill ({kind}) of {B} x {H} heads over {args.context} tokens ({S} per rank), 3 calls: "
                f"relative error {error:.2e}, validation {'passed' if ok else 'FAILED'}")
    if args.benchmark:
        gathered = [torch.empty(world, B, H, S, D, dtype=dtype, device=device) for _ in range(2)]
        gather = utils.BaselineAllGather(ctx, keys)
        keys_end = (rank + 1) * S if args.causal else world * S
        mask = causal_lower_right(S, keys_end) if args.causal else None

        def torch_way():
            for mine_, whole in zip((keys, values), gathered):
                gather(whole, mine_)
            # blocks 0..rank (causal) or all, in sequence order: (B, H, keys_end, D)
            k_all, v_all = (g[:keys_end // S].permute(1, 2, 0, 3, 4).reshape(B, H, keys_end, D) for g in gathered)
            out.copy_(F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask))

        fused_ms, torch_ms = utils.timed_ms(ctx, args, fused, torch_way)
        if rank == 0:
            ctx.log_stats(f"ring prefill through the heap {fused_ms:.3f} ms; {gather.name} "
                          f"all_gather of K and V + scaled_dot_product_attention {torch_ms:.3f} ms ({world} ranks, "
                          f"{kind}, batch {B}, {H} heads of {D}, {args.context} tokens, {args.datatype}, "
                          f"{programs} programs)")
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
