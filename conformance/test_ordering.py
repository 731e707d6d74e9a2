"""Ordering litmus tests: message passing between two ranks, many messages per launch.

Producer, for each message i: wait for the consumer's acknowledgement of i-1,
write the payload into the consumer's buffer (``iris.store``, or ``iris.put``
from a local staging buffer), then set the consumer's flag to i with
``sem="release", scope="sys"``. Consumer: spin until the flag reads i with an
``acquire`` at ``sys`` scope, load the payload, count lanes that are not
message i's, acknowledge with a release.

What the memory model guarantees, and all that is asserted: a consumer whose
acquire reads the value of a release sees every write that preceded the release
(the CTA barrier before the flag makes the other threads' payload writes
precede it too), so it never sees stale data. With a *relaxed* flag, seeing the
flag before the payload is an allowed outcome: nothing is asserted about that
case, and the planted-bug demonstration in CONTRIBUTING.md relies on it
showing up on GPUs. Two ranks that share one GPU (simulation) exchange at most
SHARED_DEVICE_MESSAGES messages per launch: there every hand-off waits for a time slice.
"""

import pytest
import torch
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import iris
from conformance import harness
from conformance.profiles import current

FLAG_SEM = tl.constexpr("release")
# Producer and consumer on one GPU (simulation) hand over each message through a time slice of
# about a millisecond, so there a launch carries at most this many messages.
SHARED_DEVICE_MESSAGES = 64


@harness.jit
def _message_passing_kernel(data, staging, flags, acks, stale, cur, producer, consumer, messages, heap_bases,
                            VIA_PUT: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    slot = data + pid * BLOCK + offs  # the consumer's buffer (the same offset on every rank)
    if cur == producer:
        for i in range(1, messages + 1):
            while tl.atomic_add(acks + pid, 0, sem="acquire", scope="sys") != i - 1:
                pass
            payload = i * 1000003 + pid * 7919 + offs
            if VIA_PUT:
                tl.store(staging + pid * BLOCK + offs, payload)
                iris.put(staging + pid * BLOCK + offs, slot, cur, consumer, heap_bases)
            else:
                iris.store(slot, payload, cur, consumer, heap_bases)
            tl.debug_barrier()  # every thread's payload precedes the flag
            iris.atomic_xchg(flags + pid, i, cur, consumer, heap_bases, sem=FLAG_SEM, scope="sys")
    elif cur == consumer:
        wrong = 0
        for i in range(1, messages + 1):
            while tl.atomic_add(flags + pid, 0, sem="acquire", scope="sys") != i:
                pass
            got = tl.load(slot)
            wrong += tl.sum((got != i * 1000003 + pid * 7919 + offs).to(tl.int32))
            tl.debug_barrier()  # every thread has read message i before it is acknowledged
            iris.atomic_xchg(acks + pid, i, cur, producer, heap_bases, sem="release", scope="sys")
        tl.store(stale + pid, wrong)


def _message_passing_on_rank(case):
    ctx = harness.context()
    rank, programs, block = ctx.get_rank(), case["programs"], case["block"]
    harness.fill_arena(case["seed"])
    base = case["offset"]
    words = programs * block
    data = harness.region(base, words, torch.int32)
    staging = harness.region(base + 4 * words, words, torch.int32)
    flags = harness.region(base + 8 * words, programs, torch.int32)
    acks = harness.region(base + 8 * words + 4 * programs, programs, torch.int32)
    flags.zero_()
    acks.zero_()
    stale = torch.full((programs,), -1, dtype=torch.int32, device=ctx.get_device())
    ctx.barrier()
    violations = []
    messages = case["messages"]
    if harness.shares_device(case["producer"], case["consumer"]):
        messages = min(messages, SHARED_DEVICE_MESSAGES)
    if rank in (case["producer"], case["consumer"]):
        violations = harness.attempt(
            _message_passing_kernel[(programs,)], data, staging, flags, acks, stale, rank, case["producer"],
            case["consumer"], messages, ctx.get_heap_bases(), VIA_PUT=case["via_put"], BLOCK=block)
    ctx.barrier()
    if rank == case["consumer"] and not violations:
        counts = stale.cpu().tolist()
        if any(counts):
            violations.append(f"stale payload lanes seen after an acquire of the flag, per program: {counts} "
                              f"({messages} messages of {block} int32 each)")
    return harness.Verdict(violations)


@pytest.mark.parametrize("via_put", [False, True], ids=["store", "put"])
@settings(max_examples=current().examples(0.5))
@given(data=st.data())
def test_message_passing_never_sees_stale_data(world, via_put, data):
    """Payload, then a release flag; acquire the flag, then the payload: never stale."""
    if world.size < 2:
        pytest.skip("message passing needs two ranks; run with --ranks 2 or more")
    producer = data.draw(st.integers(0, world.size - 1), label="producer")
    consumer = data.draw(st.integers(0, world.size - 1).filter(lambda r: r != producer), label="consumer")
    programs = data.draw(st.integers(1, 4), label="programs")
    block = data.draw(st.sampled_from((64, 1024)), label="block")
    span = 8 * programs * block + 8 * programs
    case = dict(producer=producer, consumer=consumer, programs=programs, block=block, via_put=via_put,
                messages=current().litmus_iterations,
                offset=data.draw(harness.offsets(span, 256), label="offset"),
                seed=data.draw(harness.seeds(), label="seed"))
    world.check(_message_passing_on_rank, case)
