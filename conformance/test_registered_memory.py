"""Memory from another allocator, registered without a copy (``ctx.register_external_tensor``): a kernel given the
tensor's peer-base table loads from and stores into a peer's tensor exactly as it does on the heap.

Each case draws a dtype, a size, an operation (a load from the peer into a local tensor, or a store from a local
tensor into the peer's), the acting rank and another rank, the peer. Every rank makes its own tensor off the
heap (shared memory on a backend whose heap is host memory, the device's allocator otherwise), fills it with its
own values, and registers it; the actor runs one kernel; then every rank's tensor is compared with the
expectation (the peer's holds the actor's values after a store, every other tensor is unchanged) and the tensor
is deregistered."""

import torch
import triton
import triton.language as tl
from hypothesis import given, settings
from hypothesis import strategies as st

import iris
from conformance import harness
from conformance.dtypes import values
from conformance.profiles import current

DTYPES = (torch.uint8, torch.int16, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32)


@harness.jit
def _through_table(external, local, n, cur, peer, table, STORE: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    if STORE:
        iris.store(external + offs, tl.load(local + offs, mask=mask), cur, peer, table, mask=mask)
    else:
        tl.store(local + offs, iris.load(external + offs, cur, peer, table, mask=mask), mask=mask)


def _registered_on_rank(case):
    ctx = harness.context()
    rank, device = ctx.get_rank(), ctx.get_device()
    dtype, numel, actor, peer = case["dtype"], case["numel"], case["actor"], case["peer"]
    mine = values(dtype, numel, harness.generator(case["seed"], rank))
    if ctx.backend.memory_on_host:
        external = mine.clone().share_memory_()  # shared memory: what peers can map
    else:
        external = harness.to_device(mine, device).clone()  # the device allocator's memory
    violations = harness.attempt(ctx.register_external_tensor, external)
    if violations:
        return harness.Verdict(violations)
    table = ctx.get_peer_bases(external)
    local = harness.to_device(values(dtype, numel, harness.generator(case["seed"], rank, 1)), device)
    sent = local.clone()
    ctx.barrier()
    if rank == actor:
        violations += harness.attempt(_through_table[(triton.cdiv(numel, 128),)], external, local, numel, rank, peer,
                                      table, STORE=case["store"], BLOCK=128)
    ctx.backend.synchronize(device)
    ctx.barrier()
    got = harness.byte_view(harness.to_device(external, "cpu"))
    if case["store"] and rank == peer:
        want = harness.byte_view(values(dtype, numel, harness.generator(case["seed"], actor, 1)))
    else:
        want = harness.byte_view(mine)
    if not torch.equal(got, want):
        violations.append(f"rank {rank}'s registered tensor: {int((got != want).sum())} of {got.numel()} bytes wrong")
    if rank == actor and not case["store"]:
        read = harness.byte_view(harness.to_device(local, "cpu"))
        expected = harness.byte_view(values(dtype, numel, harness.generator(case["seed"], peer)))
        if not torch.equal(read, expected):
            violations.append(f"the load from rank {peer}: {int((read != expected).sum())} bytes wrong")
    elif rank == actor and not torch.equal(harness.byte_view(local), harness.byte_view(sent)):
        violations.append("the store changed its source")
    violations += harness.attempt(ctx.deregister_external_tensor, external)
    return harness.Verdict(violations)


@st.composite
def registered_cases(draw, world_size: int):
    actor = draw(st.integers(0, world_size - 1))
    peer = (actor + draw(st.integers(1, world_size - 1))) % world_size  # another rank: the table must translate
    return dict(dtype=draw(st.sampled_from(DTYPES)), numel=draw(st.integers(1, 600)), store=draw(st.booleans()),
                actor=actor, peer=peer, seed=draw(harness.seeds()))


@settings(max_examples=current().examples(1))
@given(data=st.data())
def test_a_kernel_reaches_a_registered_tensor_as_it_reaches_the_heap(world, data):
    """Loads and stores through a registered tensor's table: any dtype, size, actor and other rank."""
    world.check(_registered_on_rank, data.draw(registered_cases(world.size), label="case"))
