"""ROCm/iris's host ``alltoall_kv``: every rank's whole flat K and V into its slot of every rank's receive buffers.

Context parallelism's exchange as one host call, with ROCm/iris's argument list: rank r's ``k_local_flat`` and
``v_local_flat`` (``chunk`` elements each) land in elements ``[r*chunk, (r+1)*chunk)`` of every rank's
``k_recv_buf`` and ``v_recv_buf`` (this rank's own slot included), then each rank signals every peer once and
waits for each peer's signal. Two launches on the current stream: the stores (a persistent grid of
``num_fetch_sms`` programs per destination striding over blocks of ``BLOCK`` elements), then one program that
signals and waits; the kernel boundary between them orders every store before the signals. A signal is counted
and consumed (``ready_flags[peer]`` goes up by one, then back down once seen), so the flags need no reset between
calls; work launched after the call on the same stream sees every rank's chunk. Before a rank sends again, its
peers must have finished reading the previous chunks (a barrier), as with any reuse of a receive buffer.

For a consumer that starts on the first block to arrive, use the tile op :func:`iris.x.send_kv` with a flag per
tile instead.

Example:
    >>> from iris.x.alltoall_kv import alltoall_kv
    >>> k_recv = ctx.zeros(world * k_local.numel(), dtype=k_local.dtype)   # v_recv alike
    >>> flags = ctx.zeros(world, dtype=torch.int32)
    >>> alltoall_kv(k_local.view(-1), v_local.view(-1), k_recv, v_recv, flags, ctx.get_device_context(),
    ...             ctx.get_rank(), ctx.get_num_ranks())
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.device import atomics, rma, sync
from iris.device.context import DeviceContext


@triton.jit
def _store_kernel(k_local, v_local, k_recv, v_recv, context, chunk, RANK: tl.constexpr, WORLD: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Each program strides over blocks of ``BLOCK`` elements, each stored into slot RANK of every rank."""
    ctx = DeviceContext.initialize(context, RANK, WORLD)
    slot = tl.cast(chunk, tl.int64) * RANK
    for block in range(tl.program_id(0), tl.cdiv(chunk, BLOCK), tl.num_programs(0)):
        offsets = tl.cast(block, tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < chunk
        k = tl.load(k_local + offsets, mask=mask)
        v = tl.load(v_local + offsets, mask=mask)
        for i in tl.static_range(WORLD):  # ranks start on different peers
            rma.store(k_recv + slot + offsets, k, RANK, (RANK + i) % WORLD, ctx.heap_bases, mask=mask)
            rma.store(v_recv + slot + offsets, v, RANK, (RANK + i) % WORLD, ctx.heap_bases, mask=mask)


@triton.jit
def _signal_and_wait_kernel(ready_flags, context, RANK: tl.constexpr, WORLD: tl.constexpr):
    """One program: count a signal on every peer's ``ready_flags[RANK]``, then wait for and consume each peer's."""
    ctx = DeviceContext.initialize(context, RANK, WORLD)
    for i in tl.static_range(1, WORLD):
        atomics.atomic_add(ready_flags + RANK, 1, RANK, (RANK + i) % WORLD, ctx.heap_bases, sem="release",
                           scope="sys")
    for i in tl.static_range(1, WORLD):
        peer = (RANK + WORLD - i) % WORLD
        sync.wait_until(ready_flags + peer, ">=", 1)
        tl.atomic_add(ready_flags + peer, -1, sem="relaxed", scope="sys")  # consumed: the next call counts from 0


def alltoall_kv(k_local_flat, v_local_flat, k_recv_buf, v_recv_buf, ready_flags, context_tensor, rank: int,
                world_size: int, BLOCK: int = 1024, num_fetch_sms: int = 32) -> None:
    """Every rank's ``k_local_flat`` / ``v_local_flat`` into its slot of every rank's ``k_recv_buf`` /
    ``v_recv_buf`` (see the module); ``ready_flags`` int32 on the heap, ``world_size`` words, zeroed once.

    Raises:
        ValueError: before any launch, where the buffers' shapes, dtypes or places do not fit.
    """
    chunk = k_local_flat.numel()
    problems = []
    if k_local_flat.dim() != 1 or v_local_flat.dim() != 1 or not (k_local_flat.is_contiguous()
                                                                  and v_local_flat.is_contiguous()):
        problems.append("k_local_flat and v_local_flat must be flat contiguous tensors (tensor.view(-1))")
    if v_local_flat.numel() != chunk:
        problems.append(f"v_local_flat has {v_local_flat.numel()} elements, k_local_flat {chunk}")
    for name, buffer, local in (("k_recv_buf", k_recv_buf, k_local_flat), ("v_recv_buf", v_recv_buf, v_local_flat)):
        if buffer.numel() != world_size * chunk or not buffer.is_contiguous():
            problems.append(f"{name} must be contiguous with world_size * chunk = {world_size * chunk} elements; "
                            f"it has {buffer.numel()}")
        if buffer.dtype != local.dtype:
            problems.append(f"{name} is {buffer.dtype}, its local chunk {local.dtype}")
    if ready_flags.dtype != torch.int32 or ready_flags.numel() < world_size:
        problems.append(f"ready_flags must be int32 with at least {world_size} words; it is {ready_flags.dtype} "
                        f"with {ready_flags.numel()}")
    if BLOCK <= 0 or BLOCK & (BLOCK - 1):
        problems.append(f"BLOCK={BLOCK} must be a power of two")
    if not 0 <= rank < world_size:
        problems.append(f"rank {rank} is outside a world of {world_size}")
    if problems:
        raise ValueError("alltoall_kv: " + "; ".join(problems))
    if chunk:
        programs = min(max(1, num_fetch_sms) * max(1, world_size - 1), triton.cdiv(chunk, BLOCK))
        _store_kernel[(programs,)](k_local_flat, v_local_flat, k_recv_buf, v_recv_buf, context_tensor, chunk,
                                   RANK=rank, WORLD=world_size, BLOCK=BLOCK)
    _signal_and_wait_kernel[(1,)](ready_flags, context_tensor, RANK=rank, WORLD=world_size)
