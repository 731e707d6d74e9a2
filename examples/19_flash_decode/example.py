"""Flash-decode across ranks: the KV cache sharded by sequence, the softmax combined through the heap in one kernel.

Each rank holds a contiguous slice of every sequence's keys and values (B x H x S/W x D). For one decoding step
(one query per sequence and head) one kernel does it all: each program takes one (sequence, head), computes
attention over this rank's slice with an online softmax (running maximum m, sum of exponentials l, and the
unnormalized output), publishes (m, l, output) on the symmetric heap with a flag, then reads every rank's triple
as soon as its flag says so and combines them by their log-sum-exp weights: out = sum_r o_r e^(m_r - M) /
sum_r l_r e^(m_r - M), with M the largest m_r. Every rank ends with the whole attention output; no collective
is launched. The partials alternate between two slots by the call's parity, so a rank that runs a call ahead
never overwrites what a slower peer still reads (it cannot run two ahead: it waits for that peer's flags).

The torch way beside it (``--benchmark``): attention over the local slice with its log-sum-exp, an all_gather
of (output, log-sum-exp) (NCCL through torch.distributed where ranks have GPUs of their own, else Iris's), and
the same combine.

    iris run -n 2 examples/19_flash_decode/example.py --validate
    iris run -n 2 examples/19_flash_decode/example.py --validate --benchmark --context 131072 --batch 4
"""

import argparse
import math
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

import iris
import iris.x

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


@triton.jit(do_not_specialize=["call"])  # a new number each call: one compiled kernel for all
def flash_decode(q, k, v, partials, flags, out, context, S, scale, call, RANK: tl.constexpr, WORLD: tl.constexpr,
                 D: tl.constexpr, BLOCK_S: tl.constexpr):
    ctx = iris.DeviceContext.initialize(context, RANK, WORLD)
    row = tl.program_id(0)  # one (sequence, head)
    rows = tl.num_programs(0)
    d = tl.arange(0, D)
    query = tl.load(q + row * D + d).to(tl.float32) * scale
    m = tl.max(tl.full((BLOCK_S,), float("-inf"), tl.float32), axis=0)  # a scalar -inf
    total = tl.sum(tl.zeros((BLOCK_S,), tl.float32), axis=0)
    acc = tl.zeros((D,), tl.float32)
    base = row.to(tl.int64) * S * D
    for start in range(0, S, BLOCK_S):  # this rank's slice of the sequence, a block of keys at a time
        s = start + tl.arange(0, BLOCK_S)
        keys = tl.load(k + base + s[:, None] * D + d[None, :], mask=s[:, None] < S, other=0.0).to(tl.float32)
        scores = tl.where(s < S, tl.sum(keys * query[None, :], axis=1), float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        weights = tl.exp(scores - m_new)
        rescale = tl.exp(m - m_new)
        values = tl.load(v + base + s[:, None] * D + d[None, :], mask=s[:, None] < S, other=0.0).to(tl.float32)
        acc = acc * rescale + tl.sum(weights[:, None] * values, axis=0)
        total = total * rescale + tl.sum(weights, axis=0)
        m = m_new
    # publish (m, l, output) in this call's slot, then the flag (release: the stores before it are seen with it)
    slot = partials + ((call % 2) * rows + row).to(tl.int64) * (D + 2)
    tl.store(slot + d, acc)
    tl.store(slot + D, m)
    tl.store(slot + D + 1, total)
    tl.debug_barrier()  # every thread's stores before the flag
    tl.atomic_xchg(flags + row, call, sem="release", scope="sys")
    # combine every rank's triple by its log-sum-exp weight, each read once its flag holds this call
    best = m
    for r in tl.static_range(WORLD):
        if r != RANK:
            iris.x.wait_tile_ready(flags, row, r, ctx, call)
            best = tl.maximum(best, iris.load(slot + D, RANK, r, ctx.heap_bases))
    numerator = tl.zeros((D,), tl.float32)
    denominator = total * 0.0
    for r in tl.static_range(WORLD):
        peer_m = iris.load(slot + D, RANK, r, ctx.heap_bases)
        peer_l = iris.load(slot + D + 1, RANK, r, ctx.heap_bases)
        weight = tl.exp(peer_m - best)
        numerator += iris.load(slot + d, RANK, r, ctx.heap_bases) * weight
        denominator += peer_l * weight
    tl.store(out + row * D + d, (numerator / denominator).to(out.dtype.element_ty))


def reference(q, keys, values, scale):
    """Attention of one query per (sequence, head) over whole sequences, in float64: (B, H, D)."""
    scores = torch.einsum("bhd,bhsd->bhs", q.double(), keys.double()) * scale
    return torch.einsum("bhs,bhsd->bhd", torch.softmax(scores, dim=-1), values.double())


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cpu = utils.on_cpu()
    parser.add_argument("--batch", type=int, default=2 if cpu else 4, help="sequences decoded at once")
    parser.add_argument("--heads", type=int, default=2 if cpu else 32, help="attention heads")
    parser.add_argument("--head-dim", type=int, default=16 if cpu else 128, help="D, a power of two")
    parser.add_argument("--context", type=int, default=96 if cpu else 32768, help="tokens of each sequence, all ranks")
    parser.add_argument("--block-s", type=int, default=32 if cpu else 64, help="keys per step of the loop")
    utils.add_check_and_timing_args(parser, "the queries and the KV cache", "the torch way", runs=100, warmup=10)
    return utils.add_common_args(parser).parse_args()


def main(args) -> int:
    dtype, B, H, D = utils.torch_dtype(args.datatype), args.batch, args.heads, args.head_dim
    if D & (D - 1):
        raise SystemExit(f"--head-dim {D}: a power of two")
    ctx = iris.iris(4 * (B * H * (2 * D + 4)) * 4 + (1 << 24))
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    if args.context % world:
        raise SystemExit(f"--context {args.context}: a multiple of the {world} ranks")
    S = args.context // world
    scale = 1.0 / math.sqrt(D)
    q = utils.seeded(7, (B, H, D), dtype).to(device)  # the same queries on every rank
    whole = (B, H, args.context, D)
    whole_k, whole_v = utils.seeded(11, whole, dtype), utils.seeded(13, whole, dtype)
    keys = whole_k[:, :, rank * S:(rank + 1) * S].contiguous().to(device)  # this rank's slice of the cache
    values = whole_v[:, :, rank * S:(rank + 1) * S].contiguous().to(device)
    partials = ctx.zeros(2 * B * H * (D + 2), dtype=torch.float32)
    flags = ctx.zeros(B * H, dtype=torch.int32)
    out = torch.empty(B, H, D, dtype=dtype, device=device)
    calls = [0]

    def fused():
        calls[0] += 1
        flash_decode[(B * H,)](q, keys, values, partials, flags, out, ctx.get_device_context(), S, scale, calls[0],
                               RANK=rank, WORLD=world, D=D, BLOCK_S=args.block_s)

    ok = True
    if args.validate:
        ctx.barrier()
        for _ in range(3):  # the slots alternate: the third call reuses the first's
            fused()
        ctx.barrier()
        want = reference(q.cpu(), whole_k, whole_v, scale)
        error = ((out.cpu().double() - want).norm() / want.norm()).item()
        ok = utils.all_passed(ctx, error < (1e-5 if dtype == torch.float32 else 2e-2))
        ctx.log(f"flash-decode of {B} x {H} heads over {args.context} tokens ({S} per rank): relative error "
                f"{error:.2e}, validation {'passed' if ok else 'FAILED'}")
    if args.benchmark:
        gathered = torch.empty(world, B, H, D + 1, dtype=torch.float32, device=device)
        gather = utils.BaselineAllGather(ctx, gathered[0])

        def torch_way():
            scores = torch.einsum("bhd,bhsd->bhs", q.float(), keys.float()) * scale
            lse = torch.logsumexp(scores, dim=-1)
            partial = torch.einsum("bhs,bhsd->bhd", torch.softmax(scores, dim=-1), values.float())
            mine = torch.cat([partial, lse[..., None]], dim=-1)
            gather(gathered, mine)
            weights = torch.softmax(gathered[..., D], dim=0)  # each rank's share: e^lse_r / sum e^lse
            out.copy_((gathered[..., :D] * weights[..., None]).sum(0).to(dtype))

        fused_ms, torch_ms = utils.timed_ms(ctx, args, fused, torch_way)
        if rank == 0:
            ctx.log_stats(f"flash-decode through the heap {fused_ms * 1e3:.1f} us; torch attention + "
                          f"{gather.name} all_gather + combine {torch_ms * 1e3:.1f} us "
                          f"({world} ranks, batch {B}, {H} heads of {D}, {args.context} tokens, {args.datatype})")
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
