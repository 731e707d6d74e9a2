"""Prefill over a paged KV cache spread across ranks: each rank reads every page where it lies, in one launch.

Context parallelism with an inference engine's paged cache (vLLM's (pages, PAGE_SIZE, H_kv, D) layout): rank r
computed, and holds in its cache pages on the symmetric heap, the keys and values of tokens [r*S, (r+1)*S) of every
sequence (S = the tokens / W), and holds those tokens' queries. A global block table, the same on every rank,
names for each logical page of each sequence the rank that holds it and the page there. One call of
``iris.x.prefill_attn.distributed_prefill_attn`` gives rank r causal attention of its queries over the whole
sequence: each program walks its key tiles in order, reading a tile from this rank's cache or, through the heap,
from the peer the table names; no cache is gathered and no collective is launched. Query heads may be grouped
(``--kv-heads`` divides ``--heads``).

The torch way beside it (``--benchmark``): all_gather of every rank's K and V (NCCL through torch.distributed
where ranks have GPUs of their own, else Iris's), then torch's scaled_dot_product_attention of this rank's queries
with the lower-right causal mask.

    iris run -n 2 examples/23_paged_prefill_across_ranks/example.py --validate
    iris run -n 2 examples/23_paged_prefill_across_ranks/example.py --validate --benchmark --context 32768
"""

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

import iris
from iris.x.prefill_attn import distributed_prefill_attn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # examples/, for examples/common
from common import utils  # noqa: E402


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cpu = utils.on_cpu()
    parser.add_argument("--batch", type=int, default=2 if cpu else 1, help="sequences")
    parser.add_argument("--heads", type=int, default=4 if cpu else 32, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=2 if cpu else 8, help="key and value heads")
    parser.add_argument("--head-dim", type=int, default=16 if cpu else 128, help="D, a power of two, 16 or more")
    parser.add_argument("--context", type=int, default=64 if cpu else 32768, help="tokens of each sequence, all ranks")
    parser.add_argument("--page-size", type=int, default=16, help="tokens per page, a power of two, 16 or more")
    utils.add_check_and_timing_args(parser, "the queries, keys, values and output", "the torch way", runs=20, warmup=5)
    return utils.add_common_args(parser).parse_args()


def main(args) -> int:
    dtype, B, H, H_kv, D, page = (utils.torch_dtype(args.datatype), args.batch, args.heads, args.kv_heads,
                                  args.head_dim, args.page_size)
    if H % H_kv:
        raise SystemExit(f"--kv-heads {H_kv} must divide --heads {H}")
    chunk_bytes = B * args.context * H_kv * D * dtype.itemsize  # K (or V) of the whole batch, a bound per rank
    ctx = iris.iris(2 * chunk_bytes + (4 * chunk_bytes if args.benchmark else 0) + (1 << 24))
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    S = args.context // world
    if args.context % world or S % page:
        raise SystemExit(f"--context {args.context}: a multiple of the {world} ranks, each rank's share a multiple "
                         f"of --page-size {page}")
    mine = slice(rank * S, (rank + 1) * S)
    whole_q = utils.seeded(7, (B, args.context, H, D), dtype)
    whole_k = utils.seeded(11, (B, args.context, H_kv, D), dtype)
    whole_v = utils.seeded(13, (B, args.context, H_kv, D), dtype)
    q = whole_q[:, mine].contiguous().to(device)
    # this rank's pages: sequence b's page j of this rank's share is page b * pages + j here
    pages = S // page
    k_cache = ctx.zeros(B * pages, page, H_kv, D, dtype=dtype)
    v_cache = ctx.zeros(B * pages, page, H_kv, D, dtype=dtype)
    k_cache.copy_(whole_k[:, mine].reshape(B * pages, page, H_kv, D).to(device))
    v_cache.copy_(whole_v[:, mine].reshape(B * pages, page, H_kv, D).to(device))
    table = torch.empty(B, world * pages, 2, dtype=torch.int32)  # logical page -> (rank, page there)
    logical = torch.arange(world * pages)
    for b in range(B):
        table[b, :, 0] = logical // pages
        table[b, :, 1] = b * pages + logical % pages
    table = table.to(device)
    kv_lens = torch.full((B,), args.context, dtype=torch.int32, device=device)
    out = torch.empty_like(q)
    ctx.barrier()  # every rank's pages written before any rank reads them

    def fused():
        distributed_prefill_attn(q, k_cache, v_cache, table, kv_lens, rank * S, ctx, out=out)

    ok = True
    if args.validate:
        group = H // H_kv
        keys = whole_k[:, :(rank + 1) * S].double().repeat_interleave(group, dim=2).transpose(1, 2)
        values = whole_v[:, :(rank + 1) * S].double().repeat_interleave(group, dim=2).transpose(1, 2)
        want = F.scaled_dot_product_attention(whole_q[:, mine].double().transpose(1, 2), keys, values,
                                              attn_mask=causal_lower_right(S, (rank + 1) * S)).transpose(1, 2)
        out.fill_(float("nan"))  # every element must be written
        fused()
        error = ((out.cpu().double() - want).norm() / want.norm()).item()
        ok = utils.all_passed(ctx, error < (1e-5 if dtype == torch.float32 else 2e-2))
        ctx.log(f"paged prefill across {world} ranks of {B} x {H} heads ({H_kv} key heads) over {args.context} "
                f"tokens ({S} per rank, pages of {page}): relative error {error:.2e}, validation "
                f"{'passed' if ok else 'FAILED'}")
    if args.benchmark:
        gathered = [torch.empty(world, B, S, H_kv, D, dtype=dtype, device=device) for _ in range(2)]
        local = [cache.view(B, S, H_kv, D) for cache in (k_cache, v_cache)]
        gather = utils.BaselineAllGather(ctx, local[0])
        mask = causal_lower_right(S, (rank + 1) * S)
        group = H // H_kv

        def torch_way():
            for part, whole in zip(local, gathered):
                gather(whole, part)
            k_all, v_all = (g[:rank + 1].permute(1, 3, 0, 2, 4).reshape(B, H_kv, (rank + 1) * S, D)
                            .repeat_interleave(group, dim=1) for g in gathered)
            out.copy_(F.scaled_dot_product_attention(q.transpose(1, 2), k_all, v_all, attn_mask=mask)
                      .transpose(1, 2))

        fused_ms, torch_ms = utils.timed_ms(ctx, args, fused, torch_way)
        if rank == 0:
            ctx.log_stats(f"paged prefill reading pages through the heap {fused_ms:.3f} ms; "
                          f"{gather.name} all_gather of K and V + scaled_dot_product_attention "
                          f"{torch_ms:.3f} ms ({world} ranks, batch {B}, {H} heads of {D}, {H_kv} key heads, "
                          f"{args.context} tokens, pages of {page}, {args.datatype})")
    ctx.barrier()
    ctx.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(utils.run(main, parse_args()))
