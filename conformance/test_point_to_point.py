"""Point to point (iris.ccl send, recv, sendrecv): every message lands whole, bit for bit, in the receiver's tensor,
and messages between two ranks are matched in the order they were sent.

Each case draws the members (all ranks, or a torch.distributed group of some), a dtype, a message size (empty
included), a block size, a number of messages in a row, and one of two patterns:
- ring: every member sendrecv's to the member ``shift`` places on and from the one ``shift`` places back;
- pairs: members 2j and 2j + 1 (in member order) pair up, the first sends every message, the second receives
  them in turn (an odd member out takes no part).
Every message has its own payload (seeded, so each rank knows every rank's) and its own receiving slot on the
heap, so a message matched out of order, lost or torn shows in its slot.
"""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance import harness
from conformance.dtypes import element_size, values
from conformance.profiles import current
from iris.ccl import Config

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.float8_e4m3fn, torch.float8_e5m2)
ALIGN = 256


def _messages_on_rank(case):
    ctx = harness.context()
    rank, device = ctx.get_rank(), ctx.get_device()
    members, dtype, numel, count = case["members"], case["dtype"], case["numel"], case["messages"]
    harness.fill_arena(case["seed"])
    group = harness.group(members)
    if rank not in members:
        return harness.Verdict([])
    me, size = members.index(rank), len(members)

    def payload(index, message):
        return values(dtype, numel, harness.generator(case["seed"], members[index], 20 + message))

    stride = -(-max(numel * element_size(dtype), 1) // ALIGN) * ALIGN
    slots = [harness.region(message * stride, numel, dtype) for message in range(count)]
    config = Config(block_size=case["block"])
    violations, source = [], None
    if case["pattern"] == "ring":
        dst, source = (me + case["shift"]) % size, (me - case["shift"]) % size
        for message in range(count):
            violations += harness.attempt(ctx.ccl.sendrecv, harness.to_device(payload(me, message), device),
                                          slots[message], members[dst], members[source], group=group, config=config)
    elif me ^ 1 < size:
        partner = me ^ 1
        for message in range(count):
            if me % 2 == 0:
                violations += harness.attempt(ctx.ccl.send, harness.to_device(payload(me, message), device),
                                              members[partner], group=group, config=config)
            else:
                violations += harness.attempt(ctx.ccl.recv, slots[message], members[partner], group=group,
                                              config=config)
        source = partner if me % 2 else None
    ctx.device_barrier(group)
    if source is not None and not violations:
        for message, slot in enumerate(slots):
            got = harness.byte_view(harness.to_device(slot, "cpu"))
            if not torch.equal(got, harness.byte_view(payload(source, message))):
                violations.append(f"message {message} from member {source}: "
                                  f"{int((got != harness.byte_view(payload(source, message))).sum())} bytes wrong")
    return harness.Verdict(violations)


@st.composite
def message_cases(draw, world_size: int):
    everyone = tuple(range(world_size))
    subset = st.lists(st.sampled_from(everyone), min_size=2, unique=True).map(lambda r: tuple(sorted(r)))
    members = draw(st.one_of(st.just(everyone), subset))
    return dict(members=members, pattern=draw(st.sampled_from(("ring", "pairs"))),
                shift=draw(st.integers(1, len(members) - 1)), dtype=draw(st.sampled_from(DTYPES)),
                numel=draw(st.integers(0, 700)), messages=draw(st.integers(1, 3)),
                block=draw(st.sampled_from((64, 512))), seed=draw(harness.seeds()))


@settings(max_examples=current().examples(1))
@given(data=st.data())
def test_messages_land_whole_and_in_order(world, data):
    """send/recv and sendrecv: any members, dtype, size (empty too) and number of messages in a row."""
    world.check(_messages_on_rank, data.draw(message_cases(world.size), label="case"))
