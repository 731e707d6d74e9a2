"""iris.ccl argument checking: errors name the bad field or tensor before any launch."""

import dataclasses
import math
import os

import pytest
import torch

import iris
from iris.ccl import Config, ReduceOp
from iris.ccl.all_reduce import far_path_refusal
from iris.ccl.all_reduce import push as all_reduce_push
from iris.ccl.config import ALL_REDUCE_VARIANTS
from iris.ccl.all_reduce.push import LL_UNPACKED, LL_WORDS, PUSH_BYTES
from iris.testing import refusals


@pytest.mark.parametrize("field,value", [("block_size", 100), ("block_size_m", 0), ("block_size_n", True),
                                         ("all_reduce_variant", "fastest"), ("all_reduce_distribution", 2),
                                         ("reduce_scatter_variant", "ring"),
                                         ("fused_bytes", -1)])
def test_config_names_the_bad_field_and_value(field, value):
    with pytest.raises(ValueError) as info:
        Config(**{field: value})
    assert f"Config.{field}={value!r}" in str(info.value)


def _misuse():
    ctx = iris.iris(4 << 20)  # room for a message one element past push's landing zones
    world = ctx.get_num_ranks()
    on_heap = ctx.zeros(world * 8, dtype=torch.float32)
    past_push = ctx.zeros(PUSH_BYTES // 4 + 1, dtype=torch.float32)  # one element past the landing zones
    past_ll = ctx.zeros(all_reduce_push.ll_elements(4) + 1, dtype=torch.float32)  # as IRIS_LL_PACK says here
    errors = refusals([
        lambda: ctx.ccl.all_gather(torch.zeros(world * 8, device=ctx.get_device()), on_heap[:8].clone()),  # not heap
        lambda: ctx.ccl.all_gather(on_heap, on_heap[:7].clone()),                                     # size
        lambda: ctx.ccl.all_reduce(on_heap, on_heap.to(torch.float64)),                                # dtype
        lambda: ctx.ccl.all_reduce(on_heap, on_heap, config=Config(all_reduce_variant="one_shot")),   # in place
        lambda: ctx.ccl.broadcast(on_heap, src=world),                                                 # src
        lambda: ctx.ccl.all_to_all(on_heap.view(world, 8), on_heap.view(world, 8), config="fast"),    # config
        lambda: ctx.ccl.reduce_scatter(on_heap[4:12], on_heap),  # output overlaps another member's part
        lambda: ctx.ccl.all_reduce(on_heap, on_heap, config=Config(hierarchy=(0,) * (world + 1))),  # hierarchy
        lambda: ctx.ccl.all_reduce(past_push, past_push, config=Config(all_reduce_variant="push")),    # too big
        lambda: ctx.ccl.all_reduce(past_ll, past_ll, config=Config(all_reduce_variant="ll")),          # too big
    ])
    ctx.barrier()
    x = ctx.full((5,), float(ctx.get_rank() + 1))
    ctx.ccl.all_reduce(x, x, op=ReduceOp.MAX)  # the pool is still usable after the refusals
    ctx.close()
    return errors, x.cpu().tolist()


def test_atomic_spinlock_and_ring_are_refused_only_for_members_on_several_nodes():
    """Across nodes (the shmem heap's far path) atomic, spinlock and ring took up to 11-6000x the default's time on
    2 x H200: asked for there, all_reduce refuses them before any launch, naming what to use."""
    for variant in ALL_REDUCE_VARIANTS:
        assert far_path_refusal(variant, across_nodes=False) is None, variant
        reason = far_path_refusal(variant, across_nodes=True)
        if variant in ("atomic", "spinlock", "ring"):
            assert reason.startswith(f"all_reduce: the {variant} variant is refused") and "two_shot" in reason
        else:
            assert reason is None, variant


def test_misuse_is_refused_before_any_launch(ranks):
    for errors, result in ranks.run(_misuse):
        assert "output is not on the symmetric heap" in errors[0], errors
        assert "output must hold" in errors[1], errors
        assert "dtype float64" in errors[2], errors
        assert "one_shot cannot run in place" in errors[3], errors
        assert "is not a member of the group" in errors[4], errors
        assert "config must be an iris.ccl.Config" in errors[5], errors
        assert "may overlap input only as this member's own part" in errors[6], errors
        assert f"Config.hierarchy names {ranks.world_size + 1} nodes" in errors[7], errors
        assert f"the push variant holds at most {PUSH_BYTES} bytes per rank" in errors[8], errors
        assert f"the ll variant holds at most {all_reduce_push.ll_elements(4)} elements of 4 bytes per rank" \
            in errors[9], errors
        assert result == [float(ranks.world_size)] * 5


def _repeated_calls():
    ctx = iris.iris(1 << 20)
    world, rank = ctx.get_num_ranks(), ctx.get_rank()
    x = ctx.full((300,), float(rank + 1))
    out = ctx.zeros(300)
    gathered = ctx.zeros(world * 300)
    seen = []
    for value in (1.0, 2.0, 3.0):  # the same tensors again: later calls replay the first call's launches
        x.fill_(value * (rank + 1))
        ctx.ccl.all_reduce(out, x)
        seen.append(out[0].item())
        ctx.ccl.all_gather(gathered, x)
        seen.append(gathered[::300].tolist())
    ctx.ccl.all_reduce(out, x, op=ReduceOp.MAX)  # another op: its own launches
    seen.append(out[0].item())
    ctx.ccl.all_reduce(out[:100], x[:100])  # another shape: its own launches
    seen.append((out[0].item(), out[100].item()))
    config = Config(all_reduce_variant="one_shot")
    ctx.ccl.all_reduce(out, x, config=config)  # a config: its own launches
    config.all_reduce_variant = "atomic"  # the same object, changed: remembered by value, so new launches
    x.fill_(4.0 * (rank + 1))
    ctx.ccl.all_reduce(out, x, config=config)
    seen.append(out[0].item())
    plans = len(ctx.ccl._plans)
    ctx.close()
    return seen, plans


def test_repeated_calls_replay_their_launches_on_new_data(ranks):
    w = ranks.world_size
    total = w * (w + 1) / 2
    for seen, plans in ranks.run(_repeated_calls):
        assert seen[0:6] == [total, [float(r + 1) for r in range(w)], 2 * total, [2.0 * (r + 1) for r in range(w)],
                             3 * total, [3.0 * (r + 1) for r in range(w)]]
        assert seen[6] == 3.0 * w
        assert seen[7] == (3 * total, 3.0 * w)  # elements past the view keep the MAX call's result
        assert seen[8] == 4 * total
        assert plans == 6  # all_reduce, all_gather, all_reduce MAX, all_reduce on the views, each config


def _broadcasts():
    ctx = iris.iris(1 << 20)
    world, rank = ctx.get_num_ranks(), ctx.get_rank()
    seen = []
    for src in range(world):
        for numel, fused_bytes in ((1000, 1 << 20), (1000, 0), (3, 0)):  # one fused launch, or three
            t = ctx.full((numel,), float(10 * rank + 1))
            ctx.ccl.broadcast(t, src=src, config=Config(block_size=64, fused_bytes=fused_bytes))
            seen.append((src, numel, fused_bytes, sorted(set(t.tolist()))))
    ctx.close()
    return seen


def test_broadcast_copies_the_sources_tensor_into_every_members(ranks):
    for seen in ranks.run(_broadcasts):
        for src, numel, fused_bytes, values in seen:
            assert values == [float(10 * src + 1)], (src, numel, fused_bytes, values)


def test_default_all_reduce_variant_follows_the_tuned_table():
    """iris/ccl/all_reduce/tuned.py is written by benchmarks/ccl.py --tune (tests/test_ccl_benchmark.py checks it is
    what the committed CSVs give); the default variant is its entry for the size, else two_shot."""
    from iris.ccl.all_reduce import ELEMENT_SIZES, choose_variant
    from iris.ccl.all_reduce.tuned import ALL_REDUCE

    assert {world for world, _ in ALL_REDUCE} <= {2, 4, 8}  # the world sizes measured (benchmarks/results/ccl_*)
    for (world, dtype), entries in ALL_REDUCE.items():
        low = 16
        for i, (below, variant) in enumerate(entries):  # every size of a range gets the range's variant
            for nbytes in {low, (low + below) // 2, below - 1}:  # where it holds them, else the next entry's
                holds = all_reduce_push.holds(variant, nbytes // ELEMENT_SIZES[dtype], ELEMENT_SIZES[dtype])
                want = variant if holds else ([v for _, v in entries[i + 1:]] or ["two_shot"])[0]
                assert choose_variant(nbytes, False, world, dtype) == want, (world, dtype, nbytes)
            low = below
        assert choose_variant(low, False, world, dtype) == "two_shot"  # past the last entry
    dtype_of_table = next(iter(ALL_REDUCE))[1]
    for (world, _), entries in ALL_REDUCE.items():  # a dtype not tuned takes the tuned one's table
        assert 1024 < entries[0][0]  # a size of the first range, that every variant holds in either dtype
        assert choose_variant(1024, False, world, "fp32") == choose_variant(1024, False, world, dtype_of_table)
    for nbytes in (1024, 16 << 20):
        assert choose_variant(nbytes, in_place=False, world_size=3, dtype="bf16") == "two_shot"  # not measured
        assert choose_variant(nbytes, in_place=True, world_size=8, dtype="bf16") == "two_shot"  # one_shot cannot


def _every_all_reduce_variant():
    ctx = iris.iris(1 << 20)
    rank = ctx.get_rank()
    seen = {}
    for variant in ALL_REDUCE_VARIANTS:
        # bfloat16: the variants that sum in float32 carry an accumulator of another type than the data's
        # (the GPU compilers refuse a loop that changes a variable's type; the interpreter does not); float16
        # too where ll moves its bits by another path than bfloat16's
        dtypes = (torch.float32, torch.int32) + (() if variant == "atomic" else (torch.bfloat16,))
        for dtype in dtypes + ((torch.float16,) if variant == "ll" else ()):
            for op in (ReduceOp.SUM, ReduceOp.MAX):
                x = ctx.full((1000,), rank + 1, dtype=dtype)  # 16 blocks of 64: many programs, a ragged tail
                out = ctx.zeros(1000, dtype=dtype)
                ctx.ccl.all_reduce(out, x, op=op, config=Config(all_reduce_variant=variant, block_size=64))
                seen[(variant, str(dtype), op.name)] = out.unique().tolist()
    ctx.close()
    return seen


@pytest.mark.slow  # every variant x dtype x op: the default tier's all_reduce cases are the others here
def test_every_all_reduce_variant_reduces_every_element(ranks):
    w = ranks.world_size
    for seen in ranks.run(_every_all_reduce_variant):
        for (variant, dtype, op), values in seen.items():
            assert values == [w * (w + 1) // 2 if op == "SUM" else w], (variant, dtype, op)


def _ll_distinct_elements(numel, pack, block=64, dtypes=(torch.bfloat16, torch.float16, torch.float32)):
    """ll, one element a word or (IRIS_LL_PACK=``pack``) two of 16 bits: each element different (a constant
    fill would hide two swapped), an odd count (the last word carries one), many programs."""
    os.environ["IRIS_LL_PACK"] = pack  # this rank process's own: read by each call's launch ("": unset)
    try:
        ctx = iris.iris(1 << 20)
        rank = ctx.get_rank()
        results = {}
        for dtype in dtypes:
            x = ctx.zeros(numel, dtype=dtype)
            x.copy_(torch.arange(numel, device=ctx.get_device()) % 16 + rank)  # sums stay exact in bfloat16
            out = ctx.full((numel,), -1.0, dtype=dtype)
            ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="ll", block_size=block))
            results[str(dtype)] = out.float().cpu()
        ctx.close()
    finally:
        del os.environ["IRIS_LL_PACK"]
    return results


@pytest.mark.parametrize("pack", ["0", "1"])
@pytest.mark.parametrize("numel", [1, 129, 1001])
def test_ll_moves_each_element_of_every_word_to_its_place(ranks, numel, pack):
    w = ranks.world_size
    want = (torch.arange(numel) % 16 * w + w * (w - 1) // 2).float()
    for results in ranks.run(_ll_distinct_elements, numel, pack):
        for dtype, got in results.items():
            assert torch.equal(got, want), (dtype, numel, (got != want).nonzero()[:8].flatten().tolist())


def test_ll_left_to_its_own_choice_packs_only_past_its_unpacked_capacity(ranks):
    """IRIS_LL_PACK unset: up to 32768 elements one a word, past that two 16-bit ones a word (float32 is refused
    there: test_misuse_is_refused_before_any_launch)."""
    w = ranks.world_size
    for numel in (32768, 32769 + 2 * 1024):
        want = (torch.arange(numel) % 16 * w + w * (w - 1) // 2).float()
        for results in ranks.run(_ll_distinct_elements, numel, "", 1024, (torch.bfloat16, torch.float16)):
            for dtype, got in results.items():
                assert torch.equal(got, want), (dtype, numel, (got != want).nonzero()[:8].flatten().tolist())


def _every_variant_on_a_group_of_one():
    import torch.distributed as dist

    ctx = iris.iris(1 << 20)
    rank = ctx.get_rank()
    groups = [dist.new_group([r]) for r in range(ctx.get_num_ranks())]  # every rank makes every group
    results = {}
    for variant in ALL_REDUCE_VARIANTS:
        x = ctx.full((100,), rank + 1.5, dtype=torch.float32)
        out = ctx.full((100,), float("nan"), dtype=torch.float32)
        ctx.ccl.all_reduce(out, x, group=groups[rank], config=Config(all_reduce_variant=variant, block_size=64))
        results[variant] = out.unique().tolist()
    ctx.close()
    return results


def test_all_reduce_over_a_group_of_one_copies_the_input(ranks):
    """A one-member group's sum is its input, for every variant (ring once wrote nothing there)."""
    for rank, results in enumerate(ranks.run(_every_variant_on_a_group_of_one)):
        for variant, values in results.items():
            assert values == [rank + 1.5], (rank, variant, values)


def _push_all_reduce_many_times(rounds, variants):
    """The barrier-free variants (push, ll) called again and again, on new data each time, in place and not,
    with groups between, taking ``variants`` in turn: their landing zones are reused every other call and
    their counters are per pair of ranks (each variant its own: a mix stays apart)."""
    import torch.distributed as dist

    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    pairs = [dist.new_group([r, (r + 1) % world]) for r in range(world)]  # every rank makes every group
    generator = torch.Generator().manual_seed(1234)
    failures = []
    for step in range(rounds):
        config = Config(all_reduce_variant=variants[step % len(variants)], block_size=64)
        numel = (97, 1000, 4096)[step % 3]  # one program, ragged blocks, more blocks than programs
        inputs = [torch.randint(-1000, 1000, (numel,), dtype=torch.int32, generator=generator).to(ctx.get_device())
                  for _ in range(world)]
        x = ctx.empty(numel, dtype=torch.int32)
        x.copy_(inputs[rank])
        out = x if step % 2 else ctx.full((numel,), -7, dtype=torch.int32)
        ctx.ccl.all_reduce(out, x, config=config)
        if not torch.equal(out, sum(inputs)):
            failures.append((step, "world", int((out != sum(inputs)).sum())))
        if step % 4 == 3:  # a pair group: rank r with r + 1, so each rank takes part in two of them
            for r in range(world):
                members = sorted({r, (r + 1) % world})
                if rank in members:
                    y = ctx.empty(numel, dtype=torch.int32)
                    y.copy_(inputs[rank])
                    ctx.ccl.all_reduce(y, y, group=pairs[r], config=config)
                    want = sum(inputs[m] for m in members)
                    if not torch.equal(y, want):
                        failures.append((step, f"pair {members}", int((y != want).sum())))
                ctx.barrier()
    ctx.close()
    return failures


@pytest.mark.slow
@pytest.mark.parametrize("variants", [("push",), ("ll",), ("push", "ll", "ll")], ids="+".join)
def test_the_barrier_free_variants_reuse_their_landing_zones_correctly(ranks, variants):
    for rank, failures in enumerate(ranks.run(_push_all_reduce_many_times, 12, variants)):
        assert failures == [], (rank, failures)


def _push_all_reduce_back_to_back(calls, variant):
    """Calls issued back to back on new data each time: a member that finishes a call early pushes the next
    one while the others still read the last (the landing zones' two halves keep them apart). One program:
    the interpreter runs a rank's programs in order, so with several a peer's next push for a program comes
    only after this rank read that program's blocks."""
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    x = ctx.arange(4096, dtype=torch.int32)
    x.mul_(rank + 1)
    out = ctx.empty(4096, dtype=torch.int32)
    config = Config(all_reduce_variant=variant, block_size=4096)
    base = torch.arange(4096, dtype=torch.int32, device=ctx.get_device()) * (world * (world + 1) // 2)
    wrong = []
    for call in range(calls):
        ctx.ccl.all_reduce(out, x, config=config)
        if not torch.equal(out, base + call * world):
            wrong.append(call)
        x.add_(1)
    ctx.close()
    return wrong


@pytest.mark.parametrize("variant", ["push", "ll"])
def test_the_barrier_free_variants_keep_back_to_back_calls_apart(ranks, variant):
    for rank, wrong in enumerate(ranks.run(_push_all_reduce_back_to_back, 60, variant)):
        assert wrong == [], (rank, wrong)


def _push_all_reduce_of_a_mebibyte():
    """A push all_reduce of 1 MiB per rank (its whole landing zone), in blocks grown to one per program."""
    ctx = iris.iris(4 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    numel = PUSH_BYTES // 4
    x = ctx.arange(numel, dtype=torch.int32)
    x.add_(rank)
    out = ctx.empty(numel, dtype=torch.int32)
    ctx.ccl.all_reduce(out, x, config=Config(all_reduce_variant="push"))
    want = torch.arange(numel, dtype=torch.int32, device=ctx.get_device()) * world + world * (world - 1) // 2
    wrong = int((out != want).sum())
    ctx.close()
    return wrong


@pytest.mark.slow  # push at small sizes runs in the default tier (here above and in the conformance properties)
def test_push_takes_a_mebibyte_per_rank(ranks):
    assert PUSH_BYTES == 1 << 20
    assert all(wrong == 0 for wrong in ranks.run(_push_all_reduce_of_a_mebibyte))


@pytest.mark.parametrize("ll,in_turn", [(False, False), (False, True), (True, False), (True, True)])
def test_every_program_counts_every_call_and_the_blocks_spread_the_message(ll, in_turn):
    """push and ll count their pushes per program and reuse each landing half every other count. If a program sat
    out a call (fewer programs for a small message), its count fell behind the others', a word could land in the
    same half in two calls in a row under different programs, and a fast member's next call overwrote a word a
    slow member still read (4 simulated ranks on one H200: 34 wrong ll results in 3000 soak calls, when ll's
    block grew with the message and its grid shrank with it). So the grid never depends on the message (on a GPU
    PUSH_PROGRAMS, each counting every call, busy or not; the interpreter one program), and only the block grows:
    from LL_BLOCK words (ll on a GPU) or the configured block, to spread the message over the programs."""
    from iris.ccl.all_reduce.push import LL_BLOCK, launch_shape
    from iris.ccl.all_reduce.push import PUSH_PROGRAMS

    sizes = (1, 63, 64, 513, 8192, 8193, 1 << 17, LL_WORDS, 1 << 19)
    shapes = [launch_shape(words, 1024, ll, in_turn) for words in sizes]
    assert {programs for _, programs in shapes} == {1 if in_turn else PUSH_PROGRAMS}, shapes
    smallest = 1024 if in_turn or not ll else LL_BLOCK
    for (block, programs), words in zip(shapes, sizes):
        assert block >= smallest and block & (block - 1) == 0, (words, block)
        assert block * programs >= words or block == smallest, (words, block, programs)  # one block a program
        assert block == smallest or block * programs < 2 * words, (words, block, programs)  # no larger than that
    assert launch_shape(8192, 1024, ll=True, in_turn=False) == (64, PUSH_PROGRAMS)  # 16 KiB of bf16
    assert launch_shape(1 << 17, 1024, ll=True, in_turn=False) == (1024, PUSH_PROGRAMS)


def test_a_tuned_push_or_ll_entry_is_the_default_in_place_too_and_never_past_its_landing_zones(monkeypatch):
    from iris.ccl.all_reduce import tuned
    from iris.ccl.all_reduce import choose_variant

    monkeypatch.setitem(tuned.ALL_REDUCE, (3, "bf16"), ((4096, "push"), (8192, "one_shot"), (1 << 40, "push")))
    assert choose_variant(1024, in_place=False, world_size=3, dtype=torch.bfloat16) == "push"
    assert choose_variant(1024, in_place=True, world_size=3, dtype=torch.bfloat16) == "push"
    assert choose_variant(4096, in_place=False, world_size=3, dtype=torch.bfloat16) == "one_shot"
    assert choose_variant(4096, in_place=True, world_size=3, dtype=torch.bfloat16) == "two_shot"
    assert choose_variant(PUSH_BYTES + 2, in_place=False, world_size=3, dtype=torch.bfloat16) == "two_shot"
    monkeypatch.setitem(tuned.ALL_REDUCE, (5, "bf16"), ((1 << 40, "ll"),))  # ll holds LL_UNPACKED elements
    monkeypatch.setenv("IRIS_LL_PACK", "0")
    assert choose_variant(2 * LL_UNPACKED, in_place=True, world_size=5, dtype=torch.bfloat16) == "ll"
    assert choose_variant(2 * LL_UNPACKED + 2, in_place=False, world_size=5, dtype=torch.bfloat16) == "two_shot"
    assert choose_variant(4 * LL_UNPACKED, in_place=False, world_size=5, dtype=torch.float32) == "ll"
    monkeypatch.delenv("IRIS_LL_PACK")  # unset: 16-bit messages past LL_UNPACKED packed, to LL_WORDS words
    assert choose_variant(2 * LL_UNPACKED + 2, in_place=False, world_size=5, dtype=torch.bfloat16) == "ll"
    assert choose_variant(4 * LL_WORDS, in_place=False, world_size=5, dtype=torch.bfloat16) == "ll"
    assert choose_variant(4 * LL_WORDS + 2, in_place=False, world_size=5, dtype=torch.bfloat16) == "two_shot"
    assert choose_variant(4 * LL_UNPACKED + 4, in_place=False, world_size=5, dtype=torch.float32) == "two_shot"
    monkeypatch.setenv("IRIS_LL_PACK", "1")  # LL_WORDS words of two 16-bit elements or one 32-bit
    ll_bytes = 4 * LL_WORDS
    assert choose_variant(ll_bytes, in_place=True, world_size=5, dtype=torch.bfloat16) == "ll"
    assert choose_variant(ll_bytes + 2, in_place=False, world_size=5, dtype=torch.bfloat16) == "two_shot"
    assert choose_variant(ll_bytes, in_place=False, world_size=5, dtype=torch.float32) == "ll"  # one per word
    assert choose_variant(ll_bytes + 4, in_place=False, world_size=5, dtype=torch.float32) == "two_shot"
    # a tuned range wider than its variant holds (ll measured to its capacity, one_shot past it): past what ll
    # holds, the next entry's variant, not two_shot
    monkeypatch.setitem(tuned.ALL_REDUCE, (5, "bf16"), ((2 * ll_bytes, "ll"), (1 << 40, "one_shot")))
    assert choose_variant(ll_bytes, in_place=False, world_size=5, dtype=torch.bfloat16) == "ll"
    assert choose_variant(ll_bytes + 2, in_place=False, world_size=5, dtype=torch.bfloat16) == "one_shot"


# (world size, the node of each member): one node, one member per node, nodes in blocks and interleaved
HIERARCHIES = {2: [(0, 0), (0, 1)], 4: [(0, 0, 1, 1), (0, 1, 0, 1), (0, 0, 0, 0), (0, 1, 2, 3)]}


def _hierarchical_all_reduce():
    from iris.ccl import hierarchy

    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    wrong = []
    for nodes in HIERARCHIES[world]:  # where the layout pays, the default takes the hierarchical variant
        variant = None if hierarchy.pays(nodes) else "hierarchical"
        config = Config(all_reduce_variant=variant, hierarchy=nodes, block_size=64)
        # numel: a multiple of every node's size, a tail of 1, fewer elements than a node has members
        for numel, dtype, op, in_place in [(1000, torch.float32, ReduceOp.SUM, False),
                                           (1001, torch.bfloat16, ReduceOp.SUM, True),
                                           (1001, torch.int32, ReduceOp.MAX, False),
                                           (3, torch.float32, ReduceOp.MIN, True),
                                           (4096 * 3, torch.int32, ReduceOp.SUM, True)]:
            pattern = torch.arange(numel, device=ctx.get_device()) % 7 - 3
            x = ctx.empty(numel, dtype=dtype)
            x.copy_(pattern * (rank + 1))
            out = x if in_place else ctx.full((numel,), -99, dtype=dtype)
            ctx.ccl.all_reduce(out, x, op=op, config=config)
            want = {ReduceOp.SUM: pattern * (world * (world + 1) // 2),  # of pattern * (r + 1) over ranks r
                    ReduceOp.MAX: torch.where(pattern > 0, pattern * world, pattern),
                    ReduceOp.MIN: torch.where(pattern < 0, pattern * world, pattern)}[op]
            if not torch.equal(out.to(torch.int64), want.to(torch.int64)):
                wrong.append((nodes, numel, str(dtype), op.name, in_place, int((out.to(torch.int64) != want).sum())))
    ctx.close()
    return wrong


@pytest.mark.slow
def test_the_hierarchical_all_reduce_reduces_every_element_for_every_node_layout(ranks):
    """Reduce-scatter inside each node, all_reduce of each slice across nodes, all_gather inside the node:
    every layout of members on nodes, ragged sizes, in place and not, every op (the layout forced by
    Config.hierarchy, since this host is one node)."""
    for rank, wrong in enumerate(ranks.run(_hierarchical_all_reduce)):
        assert wrong == [], (rank, wrong)


def test_the_hierarchy_splits_members_into_node_and_cross_node_teams():
    from iris.ccl.hierarchy import arrangement, blocked, dealt, pays, teams

    assert teams((0, 1, 2, 3), (0, 0, 1, 1), rank=2) == ((2, 3), (0, 2))
    assert teams((0, 1, 2, 3), (0, 1, 0, 1), rank=3) == ((1, 3), (2, 3))
    assert teams((4, 6, 5, 7), (1, 1, 0, 0), rank=7) == ((5, 7), (6, 7))  # member order, not rank order
    assert teams((0, 1), (0, 0), rank=1) == ((0, 1), (1,))
    with pytest.raises(ValueError, match="node 0 has 2, node 1 has 1 members"):
        teams((0, 1, 2), (0, 0, 1), rank=0)
    with pytest.raises(ValueError, match="one node per member: got 2 for 3 members"):
        teams((0, 1, 2), (0, 0), rank=0)
    assert pays((0, 0, 1, 1)) and pays((0, 1, 0, 1))
    assert not pays((0, 0, 0, 0))  # one node: nothing to save
    assert not pays((0, 1))  # one member per node: the flat all_reduce is the same traffic
    assert not pays((0, 0, 1))  # nodes of different sizes: the slices would not line up
    assert blocked((0, 0, 1, 1)) and blocked((1, 1, 0, 0)) and blocked((0, 0, 0, 0)) and blocked((0, 1))
    assert not blocked((0, 1, 0, 1)) and not blocked((0, 0, 1)) and not blocked((0, 1, 1, 0))
    assert dealt((0, 1, 0, 1)) and dealt((1, 0, 1, 0)) and dealt((0, 1, 2, 0, 1, 2))
    assert not dealt((0, 0, 1, 1)) and not dealt((0, 1, 1, 0)) and not dealt((0, 1, 0))
    assert [arrangement(n) for n in ((0, 0, 1, 1), (0, 1, 0, 1), (0, 1, 1, 0), (0, 0, 0, 0), (0, 1))] == \
        ["blocked", "dealt", None, None, None]


def _steps_inside_the_node(nodes) -> int:
    """How many steps a hierarchical all_gather or reduce_scatter takes inside the node (beside its one
    across nodes): one, for members in node blocks (every node's blocks in one launch) and for members dealt
    in turn; 0: flat."""
    from iris.ccl.hierarchy import arrangement

    return 0 if arrangement(nodes) is None else 1


def _hierarchical_all_gather():
    from iris.ccl.all_gather import all_gather

    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    wrong, steps = [], []
    for nodes in HIERARCHIES[world] + [(1, 1, 0, 0)] * (world == 4):
        config = Config(hierarchy=nodes, block_size=64)
        for shape, dtype, fused in [((1000,), torch.float32, True), ((3,), torch.bfloat16, True),
                                    ((37, 5), torch.int32, False), ((300,), torch.float32, False)]:
            mine = (torch.arange(math.prod(shape), device=ctx.get_device()) + 10000 * rank).reshape(shape)
            out = ctx.full((world * shape[0],) + shape[1:], -99, dtype=dtype)
            launches = all_gather(out, mine.to(dtype), ctx,  # the function: its launches, which ctx.ccl keeps
                                  config=dataclasses.replace(config, fused_bytes=(1 << 30) if fused else 0))
            want = torch.cat([(torch.arange(math.prod(shape), device=ctx.get_device()) + 10000 * r).reshape(shape)
                              for r in range(world)]).to(dtype)
            if not torch.equal(out, want):
                wrong.append((nodes, shape, str(dtype), fused, int((out != want).sum())))
            steps.append((nodes, fused, len(launches), _steps_inside_the_node(nodes)))
    ctx.close()
    return wrong, steps


def test_the_hierarchical_all_gather_gathers_every_block_in_member_order_for_every_node_layout(ranks):
    """With members in node blocks (as torchrun and Slurm number them), all_gather goes across nodes first
    (each member's block to the members at its place on the other nodes: 1 / G of the flat gather's traffic
    over the network) and then inside each node, every node's blocks in one step; members dealt to the nodes
    in turn (0, 1, 0, 1) the same; other layouts gather flat. Every layout, shapes, dtypes,
    fused or not (the layout forced by Config.hierarchy, since this host is one node)."""
    for rank, (wrong, steps) in enumerate(ranks.run(_hierarchical_all_gather)):
        assert wrong == [], (rank, wrong)
        for nodes, fused, launches, inside in steps:  # fused: a launch per step; else each step's barriers too
            want = (1 + inside if fused else 2 * inside + 4) if inside else (1 if fused else 3)
            assert launches == want, (rank, nodes, fused, launches)
        assert any(inside for *_, inside in steps) == (ranks.world_size == 4)


def _hierarchical_reduce_scatter():
    from iris.ccl.reduce_scatter import reduce_scatter

    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    wrong, steps = [], []
    for nodes in HIERARCHIES[world] + [(1, 1, 0, 0)] * (world == 4):
        config = Config(hierarchy=nodes, block_size=64)
        for shape, dtype, op, fused in [((1000,), torch.float32, ReduceOp.SUM, True),
                                        ((3,), torch.bfloat16, ReduceOp.SUM, True),
                                        ((37, 5), torch.int32, ReduceOp.MAX, False),
                                        ((300,), torch.float32, ReduceOp.MIN, False)]:
            def part(r):  # rank r's input: world blocks of shape, small integers (exact in every dtype)
                whole = torch.arange(world * math.prod(shape), device=ctx.get_device()) % 97 + 3 * r
                return whole.reshape((world * shape[0],) + shape[1:]).to(dtype)

            x = ctx.empty((world * shape[0],) + shape[1:], dtype=dtype)
            x.copy_(part(rank))
            out = torch.full(shape, -99, dtype=dtype, device=ctx.get_device())
            for _ in range(2):  # twice: the kept workspace reused
                launches = reduce_scatter(out, x, ctx, op=op,  # the function: its launches, which ctx.ccl keeps
                                          config=dataclasses.replace(config, fused_bytes=(1 << 30) if fused else 0))
            every = torch.stack([part(r) for r in range(world)]).to(torch.float64)
            reduce = {ReduceOp.SUM: lambda t: t.sum(0), ReduceOp.MAX: lambda t: t.amax(0),
                      ReduceOp.MIN: lambda t: t.amin(0)}[op]
            want = reduce(every)[rank * shape[0]:(rank + 1) * shape[0]].to(dtype)
            if not torch.equal(out, want):
                wrong.append((nodes, shape, str(dtype), op.value, fused, int((out != want).sum())))
            steps.append((nodes, fused, len(launches), _steps_inside_the_node(nodes)))
    # a heap with no room for the workspace: the flat reduce_scatter (every rank alike), right all the same
    x = ctx.full((world * 8,), rank + 1, dtype=torch.float32)
    for size in (1 << 16, 256, 1):  # every byte taken
        try:
            while True:
                ctx.empty(size, dtype=torch.uint8)
        except MemoryError:
            pass
    out = torch.zeros(8, device=ctx.get_device())
    launches = reduce_scatter(out, x, ctx, config=Config(hierarchy=(0, 0, 1, 1) if world == 4 else None,
                                                         fused_bytes=0))
    if not torch.equal(out, torch.full_like(out, world * (world + 1) / 2)):
        wrong.append(("heap full", out.tolist()))
    steps.append(((0,) * world, False, len(launches), 0))
    ctx.close()
    return wrong, steps


def test_the_hierarchical_reduce_scatter_reduces_every_part_for_every_node_layout(ranks):
    """With members in node blocks, reduce_scatter reduces inside the node first (each member gets its node's
    sum of the parts of its counterparts on every node: N parts) and then across nodes among the members at
    its place (its own part): (N - 1) parts per member over the network, where the flat one reads W - G.
    Members dealt to the nodes in turn (0, 1, 0, 1) the same, with one step inside the node (each place's
    counterparts' parts are one run). Other layouts reduce flat. SUM, MAX and MIN, shapes, dtypes, fused or
    not (layouts forced by Config.hierarchy, since this host is one node), each twice (the workspace kept and
    reused); where the heap has no room for the workspace, flat."""
    for rank, (wrong, steps) in enumerate(ranks.run(_hierarchical_reduce_scatter)):
        assert wrong == [], (rank, wrong)
        for nodes, fused, launches, inside in steps:  # the steps inside the node, then one across
            want = (inside + 1 if fused else 2 * inside + 3) if inside else (1 if fused else 3)
            assert launches == want, (rank, nodes, fused, launches)
        assert any(inside for *_, inside in steps) == (ranks.world_size == 4)


@pytest.mark.parametrize("value", [(0, 1.5), "0,1", (-1, 0)])
def test_config_refuses_a_malformed_hierarchy(value):
    with pytest.raises(ValueError, match=r"Config.hierarchy="):
        Config(hierarchy=value)


def _off_heap_inputs():
    """push and ll read their input only on its own rank (they push it into the peers' landing zones), so it
    may live anywhere on the device; the variants whose peers read the input still refuse one off the heap."""
    from iris.ccl.all_reduce import all_reduce_to_new

    ctx = iris.iris(1 << 22)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    wrong = []
    for numel, variant in ((300, "push"), (300, "ll"), (1000, None)):
        x = torch.arange(numel, dtype=torch.float32, device=device) * (rank + 1)  # not on the heap
        want = torch.arange(numel, dtype=torch.float32, device=device) * (world * (world + 1) // 2)
        config = Config(all_reduce_variant=variant) if variant else None
        out = torch.full((numel,), -1.0, device=device)
        ctx.ccl.all_reduce(out, x, config=config)
        y = x.clone()
        ctx.ccl.all_reduce(y, y, config=config)  # in place, off the heap
        z = all_reduce_to_new(x, ctx, stage=lambda t: 1 / 0)  # no copy (the torch ops' and iris.inference's form)
        wrong += [(variant, name) for name, got in (("out", out), ("in place", y), ("new", z))
                  if not torch.equal(got, want)]
    errors = refusals([lambda: ctx.ccl.all_reduce(torch.zeros(8, device=device), torch.ones(8, device=device),
                                                  config=Config(all_reduce_variant="one_shot"))])
    ctx.close()
    return wrong, errors


def test_push_and_ll_take_an_input_off_the_heap(ranks):
    for rank, (wrong, errors) in enumerate(ranks.run(_off_heap_inputs)):
        assert wrong == [], (rank, wrong)
        assert "input is not on the symmetric heap" in errors[0], (rank, errors)


# (elements, dtype, op) of the two-member two_shot test: the default tier's few (each pair of dtype and op is another
# compilation of the kernels, for the CPU and for each cross-compile target), and the slow tier's whole matrix
TWO_SHOT_FEW = ((4099, torch.float32, ReduceOp.SUM), (1000, torch.bfloat16, ReduceOp.MAX),
                (4099, torch.int32, ReduceOp.SUM))
TWO_SHOT_ALL = tuple((numel, dtype, op) for numel in (1, 1000, 4099)  # one block, a ragged tail, an odd count of
                     for dtype in (torch.float32, torch.bfloat16, torch.int32)  # blocks of 64
                     for op in (ReduceOp.SUM, ReduceOp.MAX))


def _two_shot_of_two_members(writes, cases):
    """two_shot unfused (three launches, or five where the halves are written first), out of place and in place."""
    from iris.ccl.all_reduce import all_reduce

    os.environ["IRIS_TWO_SHOT_WRITES"] = writes
    try:
        ctx = iris.iris(1 << 22)
        rank, world = ctx.get_rank(), ctx.get_num_ranks()
        wrong, launches = [], set()
        for numel, dtype, op in cases:
            def part(r):  # distinct small integers on every rank, exact in every dtype
                return (torch.arange(numel, device=ctx.get_device()) % 13 + 5 * r).to(dtype)
            every = torch.stack([part(r) for r in range(world)]).to(torch.float64)
            want = (every.sum(0) if op is ReduceOp.SUM else every.amax(0)).to(dtype)
            for in_place in (False, True):
                x = ctx.empty(numel, dtype=dtype)
                x.copy_(part(rank))
                out = x if in_place else ctx.full((numel,), -99, dtype=dtype)
                config = Config(all_reduce_variant="two_shot", block_size=64, fused_bytes=0)
                launched = all_reduce(out, x, ctx, op=op, config=config)
                launches.add((in_place, len(launched)))
                if not torch.equal(out, want):
                    wrong.append((numel, str(dtype), op.name, in_place, int((out != want).sum())))
        ctx.close()
        return wrong, sorted(launches)
    finally:
        del os.environ["IRIS_TWO_SHOT_WRITES"]


@pytest.mark.parametrize("writes,cases", [("1", TWO_SHOT_FEW),
                                          pytest.param("1", TWO_SHOT_ALL, marks=pytest.mark.slow),
                                          pytest.param("0", TWO_SHOT_ALL, marks=pytest.mark.slow)],
                         ids=["writes-few", "writes-all", "reads-all"])
def test_two_shot_of_two_members_writes_each_half_to_its_owner_first_out_of_place(ranks, writes, cases):
    """Two members, a separate output, past fused_bytes: each member first writes its input's other half into
    the other's output (the link keeps its rate both ways for writes, not for reads), then sums its own half
    and writes it to both (five launches: three barriers between and around two kernels). In place, with
    IRIS_TWO_SHOT_WRITES=0, or with more members: each member reads the other's half (three launches). The
    result is the same either way."""
    for rank, (wrong, launches) in enumerate(ranks.run(_two_shot_of_two_members, writes, cases)):
        assert wrong == [], (rank, wrong)
        out_of_place = 5 if writes == "1" and ranks.world_size == 2 else 3
        assert launches == [(False, out_of_place), (True, 3)], (rank, launches)


def _far_path_choices():
    """Members on two nodes (forced with Config.hierarchy on this one host): the default variant up to ll's
    capacity, and how many launches a two_shot of two members takes into a separate output, in place, fused
    and not."""
    from iris.ccl.all_reduce import all_reduce, all_reduce_preamble

    ctx = iris.iris(1 << 22)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    two_nodes = tuple(range(world)) if world == 2 else None  # each member a node of its own
    chosen = {}
    for numel in (512, 1 << 18):  # 1 KiB and 512 KiB of bfloat16: ll's whole range, its capacity included
        x = ctx.ones(numel, dtype=torch.bfloat16)
        for nodes in (None, two_nodes):
            chosen[(numel, nodes is not None)] = all_reduce_preamble(x, x, ctx, Config(hierarchy=nodes)).variant
    launches = {}
    x = ctx.full((1000,), rank + 1, dtype=torch.float32)
    for fused_bytes in (1 << 30, 0):
        for in_place in (False, True):
            out = ctx.full((1000,), rank + 1, dtype=torch.float32) if in_place else ctx.zeros(1000)
            config = Config(all_reduce_variant="two_shot", block_size=64, fused_bytes=fused_bytes, hierarchy=two_nodes)
            launched = all_reduce(out, out if in_place else x, ctx, config=config)
            launches[(fused_bytes > 0, in_place)] = (len(launched), out.unique().tolist())
    ctx.close()
    return chosen, launches


def test_members_on_two_nodes_take_ll_up_to_its_capacity_and_two_shot_by_writes_at_any_size(ranks):
    """On the far path (2 x H200, shmem heap, IRIS_NODE_MAP=0,1) ll took 12.1 us at 512 KiB against push's 22.7 (the
    tuned table's choice there for one node), and two_shot by writes without the fused launch 25-37 us at
    512 KiB-4 MiB against the fused reads' 36-79: members on two nodes take those (on one node the table's)."""
    from iris.ccl.all_reduce import choose_variant

    w = ranks.world_size
    for rank, (chosen, launches) in enumerate(ranks.run(_far_path_choices)):
        for (numel, far), variant in chosen.items():
            near = choose_variant(2 * numel, True, w, torch.bfloat16)
            assert variant == ("ll" if far and w == 2 else near), (rank, numel, far, variant)
        writes = 5 if w == 2 else 3  # two launches between three barriers, or reads (three launches unfused)
        assert launches == {(True, False): (5 if w == 2 else 1, [w * (w + 1) / 2]),
                            (True, True): (1, [w * (w + 1) / 2]),
                            (False, False): (writes, [w * (w + 1) / 2]),
                            (False, True): (3, [w * (w + 1) / 2])}, (rank, launches)


# ---------------------------------------------------------------- all_to_all by copies


def _all_to_all_by_copies():
    """Every shape class (one row, odd widths, a torch tensor as input, a team of some ranks), replayed on new
    data, against the kernel variant's result and the definition."""
    ctx = iris.iris(1 << 22)
    rank, world, device = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
    wrong = []
    for rows, width, dtype, team in [(5, 3, torch.float32, None), (1, 8, torch.bfloat16, None),
                                     (17, 1, torch.int32, None), (4, 6, torch.float16, list(range(world))[::-1]),
                                     (3, 2, torch.float32, [0])]:
        members = list(range(world)) if team is None else team
        if rank not in members:
            continue
        count, index = len(members), members.index(rank)

        def block(sender, receiver, round_):  # what member ``sender`` sends member ``receiver``
            return (torch.arange(rows * width).reshape(rows, width) + 1000 * sender + 100 * receiver + round_) \
                .to(dtype)

        out = ctx.full((rows, count * width), -1, dtype=dtype)
        for round_ in range(3):
            x = torch.cat([block(index, j, round_) for j in range(count)], dim=1).to(device)  # not on the heap
            ctx.ccl.all_to_all(out, x, group=team, config=Config(all_to_all_variant="copies"))
            expected = torch.cat([block(i, index, round_) for i in range(count)], dim=1)
            if not torch.equal(out.cpu(), expected):
                wrong.append((rows, width, str(dtype), team, round_))
        by_kernel = ctx.full((rows, count * width), -1, dtype=dtype)
        ctx.ccl.all_to_all(by_kernel, x, group=team)
        if not torch.equal(by_kernel.cpu(), out.cpu()):
            wrong.append((rows, width, str(dtype), team, "differs from the kernel variant"))
    ctx.close()
    return wrong


def test_all_to_all_by_copies_exchanges_column_blocks_like_the_kernel(ranks):
    assert ranks.run(_all_to_all_by_copies) == [[]] * ranks.world_size


def test_the_all_to_all_variant_is_checked():
    assert Config(all_to_all_variant="copies").all_to_all_variant == "copies"
    with pytest.raises(ValueError, match="all_to_all_variant='ring'.*persistent, copies"):
        Config(all_to_all_variant="ring")
