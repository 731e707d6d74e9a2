"""signal / wait_until: hand-offs that never lose or reorder a message, and every comparison.

- token ring: rank r waits until its word equals round k, then signals round k to the next
  rank ("set"); after many rounds every word holds the last round, and no wait returned a
  value other than the one it waited for;
- counting: every rank and program signals ``op="add"`` into one rank's counter; that rank's
  ``wait_until(counter, ">=", total)`` returns and the counter is exactly the total;
- comparisons: for each of ==, !=, >=, >, <=, <, a waiter is released only by the signal that
  makes its comparison true, and returns the value it saw.
"""

import pytest
import torch
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import iris
from conformance import harness
from conformance.profiles import current

COMPARISONS = ("==", "!=", ">=", ">", "<=", "<")


@harness.jit
def _ring_kernel(words, seen, cur, world, rounds, heap_bases, context, VIA_CONTEXT: tl.constexpr,
                 RANK: tl.constexpr, WORLD: tl.constexpr):
    nxt = (cur + 1) % world
    for k in range(1, rounds + 1):
        if cur != 0:
            if VIA_CONTEXT:
                got = iris.DeviceContext.initialize(context, RANK, WORLD).wait_until(words, "==", k)
            else:
                got = iris.wait_until(words, "==", k)
        else:
            got = k
        tl.store(seen + k - 1, got)
        if VIA_CONTEXT:
            iris.DeviceContext.initialize(context, RANK, WORLD).signal(words, k, to_rank=(RANK + 1) % WORLD)
        else:
            iris.signal(words, k, cur, nxt, heap_bases)
        if cur == 0:
            iris.wait_until(words, "==", k)  # the token came round


def _ring_on_rank(case):
    ctx = harness.context()
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    harness.fill_arena(case["seed"])
    words = harness.region(case["offset"], 1, torch.int32)
    words.zero_()
    seen = torch.full((case["rounds"],), -1, dtype=torch.int32, device=ctx.get_device())
    ctx.barrier()
    violations = harness.attempt(_ring_kernel[(1,)], words, seen, rank, world, case["rounds"], ctx.get_heap_bases(),
                                 ctx.get_device_context(), VIA_CONTEXT=case["via_context"], RANK=rank, WORLD=world)
    ctx.barrier()
    got = seen.cpu().tolist()
    if got != list(range(1, case["rounds"] + 1)):
        violations.append(f"wait_until returned {got[:12]}..., expected 1..{case['rounds']}")
    if int(words.item()) != case["rounds"]:
        violations.append(f"the word holds {int(words.item())} after {case['rounds']} rounds")
    return harness.Verdict(violations)


@settings(max_examples=current().examples(0.5))
@given(data=st.data())
def test_token_ring_hands_off_every_round(world, data):
    """signal(set) + wait_until(==) pass a token round the ring, round after round, in order."""
    case = data.draw(st.fixed_dictionaries(dict(
        rounds=st.integers(1, current().barrier_rounds), via_context=st.booleans(),
        offset=harness.offsets(4, 4), seed=harness.seeds())),
        label="case")
    world.check(_ring_on_rank, case)


@harness.jit
def _count_kernel(counter, result, cur, owner, per_program, total, heap_bases):
    for _ in range(0, per_program):
        iris.signal(counter, 1, cur, owner, heap_bases, op="add")
    if cur == owner:
        if tl.program_id(0) == tl.num_programs(0) - 1:  # waits only on lower program ids (and other ranks)
            tl.store(result, iris.wait_until(counter, ">=", total).to(tl.int64))


def _count_on_rank(case):
    ctx = harness.context()
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    harness.fill_arena(case["seed"])
    dtype = torch.int32 if case["width"] == 32 else torch.int64
    counter = harness.region(case["offset"], 1, dtype)
    counter.zero_()
    result = torch.full((1,), -1, dtype=torch.int64, device=ctx.get_device())
    total = world * case["programs"] * case["per_program"]
    ctx.barrier()
    violations = harness.attempt(_count_kernel[(case["programs"],)], counter, result, rank, case["owner"],
                                 case["per_program"], total, ctx.get_heap_bases())
    ctx.barrier()
    if rank == case["owner"]:
        if int(counter.item()) != total:
            violations.append(f"counter is {int(counter.item())} after {total} signals of +1")
        if int(result.item()) != total:
            violations.append(f"wait_until(>=, {total}) returned {int(result.item())}")
    return harness.Verdict(violations)


@settings(max_examples=current().examples(0.5))
@given(data=st.data())
def test_add_signals_are_all_counted(world, data):
    """Every rank's programs signal +1 into one counter; the owner's wait_until(>=) sees the exact total."""
    case = data.draw(st.fixed_dictionaries(dict(
        owner=st.integers(0, world.size - 1), programs=st.integers(1, 4), per_program=st.integers(1, 8),
        width=st.sampled_from((32, 64)),
        offset=harness.offsets(8, 8), seed=harness.seeds())),
        label="case")
    world.check(_count_on_rank, case)


@harness.jit
def _comparison_kernel(word, result, cur, waiter, signaller, start, steps, target, heap_bases,
                       CMP: tl.constexpr):
    if cur == waiter:
        tl.store(result, iris.wait_until(word, CMP, target))
        iris.signal(word + 1, 1, cur, signaller, heap_bases)  # released: tell the signaller to stop
    if cur == signaller:
        # Step the waiter's word from start by one each time until the waiter reports back.
        value = start
        stop = tl.atomic_add(word + 1, 0, sem="acquire", scope="sys")
        while stop == 0:
            if value != start + steps:
                value += tl.where(steps > 0, 1, -1)
                iris.signal(word, value, cur, waiter, heap_bases)
            stop = tl.atomic_add(word + 1, 0, sem="acquire", scope="sys")


def _satisfies(seen: int, cmp: str, target: int) -> bool:
    return {"==": seen == target, "!=": seen != target, ">=": seen >= target, ">": seen > target,
            "<=": seen <= target, "<": seen < target}[cmp]


def _comparison_on_rank(case):
    ctx = harness.context()
    rank = ctx.get_rank()
    harness.fill_arena(case["seed"])
    word = harness.region(case["offset"], 2, torch.int32)
    word.copy_(torch.tensor([case["start"], 0], dtype=torch.int32))
    result = torch.full((1,), -99999, dtype=torch.int32, device=ctx.get_device())
    ctx.barrier()
    violations = []
    if rank in (case["waiter"], case["signaller"]):
        violations = harness.attempt(_comparison_kernel[(1,)], word, result, rank, case["waiter"], case["signaller"],
                                     case["start"], case["steps"], case["target"], ctx.get_heap_bases(),
                                     CMP=case["cmp"])
    ctx.barrier()
    if rank == case["waiter"] and not violations:
        seen = int(result.item())
        reachable = range(case["start"], case["start"] + case["steps"] + (1 if case["steps"] >= 0 else -1),
                          1 if case["steps"] >= 0 else -1)
        if not _satisfies(seen, case["cmp"], case["target"]) or seen not in reachable:
            violations.append(f"wait_until({case['cmp']} {case['target']}) returned {seen}, which does not "
                              f"satisfy it or was never written (values {reachable.start}..{reachable.stop})")
    return harness.Verdict(violations)


@st.composite
def comparison_cases(draw, world_size):
    cmp = draw(st.sampled_from(COMPARISONS))
    start = draw(st.integers(-50, 50))
    target = draw(st.integers(-50, 50))
    # A walk from start that reaches a value satisfying the comparison.
    toward = 1 if cmp in (">=", ">") or (cmp == "==" and target >= start) else -1
    if cmp == "!=":
        steps = draw(st.sampled_from((-1, 1))) if start == target else draw(st.integers(-3, 3))
    elif cmp == "==":
        steps = target - start
    else:
        bound = target + (1 if cmp == ">" else -1 if cmp == "<" else 0)
        steps = max(0, (bound - start) * toward) * toward + draw(st.integers(0, 3)) * toward
    waiter = draw(st.integers(0, world_size - 1))
    signaller = draw(st.integers(0, world_size - 1).filter(lambda r: r != waiter))
    return dict(cmp=cmp, start=start, target=target, steps=steps, waiter=waiter, signaller=signaller,
                offset=draw(harness.offsets(8, 8)), seed=draw(harness.seeds()))


@settings(max_examples=current().examples(1))
@given(data=st.data())
def test_wait_until_honours_every_comparison(world, data):
    """The waiter returns a value that satisfies its comparison and that the signaller really wrote."""
    if world.size < 2:
        pytest.skip("a waiter and a signaller need two ranks; run with --ranks 2 or more")
    world.check(_comparison_on_rank, data.draw(comparison_cases(world.size), label="case"))
