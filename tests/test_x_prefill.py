"""iris.x.prefill_attn against attention computed in float64 from the definition: a contiguous cache, a paged one
(shuffled pages, sequences of different lengths, a cached prefix, grouped heads), and a paged cache spread over the
ranks read through the heap, each rank holding a chunk of the queries (2 ranks; any world with IRIS_TEST_WORLDS)."""

import math

import pytest
import torch

import iris
from iris.x.prefill_attn import distributed_prefill_attn, paged_prefill_attn, reference_prefill_attn

D, HEADS, KV_HEADS, PAGE = 16, 4, 2, 16


def attention(q, k, v, q_start):
    """float64 causal attention of q (S, H, D) at positions q_start.. over k, v (S_kv, H_kv, D)."""
    q, k, v = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = torch.einsum("shd,thd->hst", q, k) / math.sqrt(q.shape[-1])
    positions = torch.arange(q.shape[0])[:, None] + q_start
    scores = scores.masked_fill(torch.arange(k.shape[0])[None, :] > positions, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query with no key: zeros
    return torch.einsum("hst,thd->shd", weights, v)


DEVICE = torch.device("cpu" if iris.runtime.SELECTED == "cpu" else "cuda")  # torch's name for HIP GPUs too


def _close(got, want, dtype) -> bool:
    """Within bfloat16's error, or float32's; on GPUs float32 products go through TF32 (10 mantissa bits)."""
    exact = dtype == torch.float32 and iris.runtime.SELECTED == "cpu"
    tolerance = 1e-4 if exact else (5e-3 if dtype == torch.float32 else 2e-2)
    return torch.allclose(got.double().cpu(), want, atol=tolerance, rtol=tolerance)


def _paged(k, v, pages_total, order, page=PAGE):
    """k, v (S_kv, H_kv, D) into caches of ``pages_total`` pages at the page numbers ``order`` lists."""
    k_cache = torch.full((pages_total, page, k.shape[1], D), float("nan"), dtype=k.dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    for j, p in enumerate(order):
        rows = slice(j * page, min((j + 1) * page, k.shape[0]))
        n = rows.stop - rows.start
        k_cache[p, :n], v_cache[p, :n] = k[rows], v[rows]
        k_cache[p, n:], v_cache[p, n:] = 0.0, 0.0  # the slots past the sequence: written, never seen
    return k_cache, v_cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s, s_kv", [(24, 24), (5, 37), (33, 33)])
def test_reference_prefill_attn_matches_the_definition(dtype, s, s_kv):
    g = torch.Generator().manual_seed(s * 100 + s_kv)
    q = torch.randn(s, HEADS, D, generator=g).to(dtype)
    k, v = (torch.randn(s_kv, KV_HEADS, D, generator=g).to(dtype) for _ in range(2))
    got = reference_prefill_attn(q.to(DEVICE), k.to(DEVICE), v.to(DEVICE))
    assert got.shape == q.shape and got.dtype == dtype
    assert _close(got, attention(q, k, v, s_kv - s), dtype)


def test_paged_prefill_attn_reads_shuffled_pages_of_sequences_of_different_lengths():
    g = torch.Generator().manual_seed(7)
    s, lens = 20, [20, 45]  # the second sequence: a cached prefix of 25 positions, then the 20 queries
    q = torch.randn(2, s, HEADS, D, generator=g)
    ks = [torch.randn(n, KV_HEADS, D, generator=g) for n in lens]
    vs = [torch.randn(n, KV_HEADS, D, generator=g) for n in lens]
    pages = [math.ceil(n / PAGE) for n in lens]
    order = torch.randperm(sum(pages), generator=g).tolist()
    k_cache = torch.zeros(sum(pages), PAGE, KV_HEADS, D)
    v_cache = torch.zeros_like(k_cache)
    table = torch.full((2, max(pages)), -1, dtype=torch.int32)
    for b, n in enumerate(lens):
        mine = order[sum(pages[:b]):sum(pages[:b + 1])]
        kc, vc = _paged(ks[b], vs[b], sum(pages), mine)
        for p in mine:
            k_cache[p], v_cache[p] = kc[p], vc[p]
        table[b, :len(mine)] = torch.tensor(mine)
    out = torch.full_like(q, float("nan"), device=DEVICE)
    got = paged_prefill_attn(q.to(DEVICE), k_cache.to(DEVICE), v_cache.to(DEVICE), table.to(DEVICE),
                             torch.tensor(lens, dtype=torch.int32, device=DEVICE), out=out)
    assert got.data_ptr() == out.data_ptr()
    for b, n in enumerate(lens):
        assert _close(got[b], attention(q[b], ks[b], vs[b], n - s), torch.float32), b


@pytest.mark.parametrize("call, message", [
    (lambda q, k: reference_prefill_attn(q[..., :8], k[..., :8], k[..., :8]), "power of two"),
    (lambda q, k: reference_prefill_attn(q, torch.randn(24, 3, D), torch.randn(24, 3, D)), "must divide"),
    (lambda q, k: reference_prefill_attn(q, k, k, causal=False), "only causal"),
    (lambda q, k: reference_prefill_attn(q, k.half(), k.half()), "share dtype"),
    (lambda q, k: paged_prefill_attn(q, k.view(2, 12, 2, D), k.view(2, 12, 2, D),
                                     torch.zeros(1, 2, dtype=torch.int32), [24]), "PAGE_SIZE"),
    (lambda q, k: paged_prefill_attn(q, k.view(1, 24, 2, D)[:, :16], k.view(1, 24, 2, D)[:, :16],
                                     torch.zeros(1, 2), [24]), "block_table must be"),
    (lambda q, k: paged_prefill_attn(q, k.view(1, 24, 2, D)[:, :16], k.view(1, 24, 2, D)[:, :16],
                                     torch.zeros(1, 2, dtype=torch.int32), [24, 3]), "seq_lens must be"),
])
def test_bad_arguments_are_refused_before_any_launch(call, message):
    q, k = torch.randn(24, HEADS, D), torch.randn(24, KV_HEADS, D)  # refused before they would reach a device
    with pytest.raises((ValueError, TypeError), match=message):
        call(q, k)


def _distributed(dtype_name):
    """Each rank holds a chunk of the queries and, of the pages, those the table gives it (not its own chunk's:
    every tile is read from wherever it lies); the result against the float64 definition."""
    dtype = getattr(torch, dtype_name)
    ctx = iris.iris(1 << 22)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    chunk = 24
    total = chunk * world  # the keys of the whole sequence end with the last rank's queries
    g = torch.Generator().manual_seed(11)  # the same whole sequence on every rank
    q = torch.randn(2, total, HEADS, D, generator=g).to(dtype)
    k = torch.randn(2, total, KV_HEADS, D, generator=g).to(dtype)
    v = torch.randn(2, total, KV_HEADS, D, generator=g).to(dtype)
    lens = [total, total - 5]  # the second sequence's last keys are not there yet: its last queries see fewer
    pages = math.ceil(total / PAGE)
    table = torch.zeros(2, pages, 2, dtype=torch.int32)
    slots = [0] * world
    k_cache = ctx.zeros(2 * pages, PAGE, KV_HEADS, D, dtype=dtype)
    v_cache = ctx.zeros(2 * pages, PAGE, KV_HEADS, D, dtype=dtype)
    for b in range(2):
        for j in range(pages):
            owner = (j * 7 + b + 1) % world  # scattered over the ranks
            table[b, j] = torch.tensor([owner, slots[owner]])
            if owner == rank:
                rows = slice(j * PAGE, min((j + 1) * PAGE, total))
                k_cache[slots[owner], :rows.stop - rows.start] = k[b, rows].to(device)
                v_cache[slots[owner], :rows.stop - rows.start] = v[b, rows].to(device)
            slots[owner] += 1
    ctx.barrier()  # every rank's pages written
    mine = slice(rank * chunk, (rank + 1) * chunk)
    got = distributed_prefill_attn(q[:, mine].to(device), k_cache, v_cache, table.to(device),
                                   torch.tensor(lens, dtype=torch.int32, device=device), rank * chunk, ctx)
    wrong = []
    for b in range(2):
        want = attention(q[b], k[b, :lens[b]], v[b, :lens[b]], 0)[mine]
        if not _close(got[b], want, dtype):
            wrong.append((b, float((got[b].double().cpu() - want).abs().max())))
    ctx.barrier()
    ctx.close()
    return wrong


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
def test_distributed_prefill_attn_reads_every_page_where_it_lies(ranks, dtype_name):
    assert ranks.run(_distributed, dtype_name) == [[]] * ranks.world_size
