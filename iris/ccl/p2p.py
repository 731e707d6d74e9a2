"""Point to point: ``send``, ``recv`` and ``sendrecv`` between two ranks, on the device, no host round trip.

By rendezvous, with no staging copy: ``recv`` posts where its tensor is (offset on the receiver's heap, size)
into a mailbox on the sender and waits; ``send`` waits for that post, stores its tensor into the receiver's
and signals it. The counts live on the device, so a CUDA graph can capture the calls; messages between two
ranks match in send order. ``send`` waits for the matching post (as MPI's synchronous send): two ranks
sending to each other call ``sendrecv`` (which posts first) or order their calls. The received tensor is on
the heap; the sent one may be any device tensor of the same dtype and size.

Example:
    >>> x = ctx.zeros(1024)
    >>> if ctx.get_rank() == 0:
    ...     ctx.ccl.send(torch.ones(1024, device=ctx.get_device()), dst=1)
    ... elif ctx.get_rank() == 1:
    ...     ctx.ccl.recv(x, src=0)                     # x is all ones
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from iris.ccl import _common
from iris.device import rma, sync
from iris.host.replay import bind
from iris.memory.reserved import Region, declare

# A rank's mailbox words per peer ("ccl.p2p_mail", [peer][word]): on the sender, the peer's posts (receives posted,
# the last one's heap offset and bytes); on the receiver, the sender's count of messages stored.
POSTED = tl.constexpr(0)
OFFSET = tl.constexpr(1)
NBYTES = tl.constexpr(2)
DONE = tl.constexpr(3)
WORDS = tl.constexpr(4)
# the mailbox; this rank's counts of the messages sent to and received from each peer, and of a send's programs
# done (local)
REGIONS = declare(Region("ccl.p2p_mail", WORDS.value, torch.int64, order=60, per_rank=True),
                  Region("ccl.p2p_sent", 1, torch.int64, per_rank=True, on_heap=False),
                  Region("ccl.p2p_received", 1, torch.int64, per_rank=True, on_heap=False),
                  Region("ccl.p2p_finished", 1, torch.int32, per_rank=True, on_heap=False))


@triton.jit
def _recv_kernel(offset, nbytes, mail, received, src, cur, heap_bases, POST: tl.constexpr, WAIT: tl.constexpr):
    """One program. POST: count one more receive from ``src`` and post this rank's tensor (``nbytes`` at
    ``offset`` of its heap) into its mailbox on ``src``. WAIT: wait until ``src`` says it stored that many."""
    count = received + src
    if POST:
        k = tl.load(count) + 1
        tl.store(count, k)
        box = mail + cur * WORDS  # this rank's box on src
        rma.store(box + OFFSET, offset, cur, src, heap_bases)
        rma.store(box + NBYTES, nbytes, cur, src, heap_bases)
        sync.signal(box + POSTED, k, cur, src, heap_bases)  # release: the box's words before the count
    if WAIT:
        sync.wait_until(mail + src * WORDS + DONE, ">=", tl.load(count))


@triton.jit
def _send_kernel(src_tensor, numel, heap_start, mail, sent, finished, dst, cur, heap_bases, ELEMENT: tl.constexpr,
                 BLOCK: tl.constexpr):
    """Program p: elements [p * BLOCK, (p + 1) * BLOCK) of ``src_tensor`` (``numel`` of ELEMENT bytes) into the
    tensor ``dst`` posted for the next message, once posted; the last program to finish signals ``dst``."""
    count = sent + dst
    k = tl.load(count) + 1  # every program reads it before the last one, which alone moves it, has finished
    box = mail + dst * WORDS
    sync.wait_until(box + POSTED, ">=", k)
    room = tl.load(box + NBYTES) // ELEMENT
    target = tl.cast(heap_start + tl.load(box + OFFSET), src_tensor.dtype)  # the posted tensor, in this rank's view
    offs = tl.cast(tl.program_id(0), tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < tl.minimum(numel, room)
    rma.store(target + offs, tl.load(src_tensor + offs, mask=mask), cur, dst, heap_bases, mask=mask)
    tl.debug_barrier()
    done = tl.atomic_add(finished + dst, 1, sem="acq_rel", scope="sys")  # acquires every earlier program's stores
    if done == tl.num_programs(0) - 1:
        tl.store(finished + dst, 0)  # for the next message to dst
        tl.store(count, k)
        sync.signal(mail + cur * WORDS + DONE, k, cur, dst, heap_bases)  # this rank's box on dst; release, sys


def _peer(ctx, what: str, name: str, rank, group) -> None:
    members = ctx.team.participants(group)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank not in members.ranks:
        raise ValueError(f"{what}: {name}={rank!r} is not a member of the group {list(members.ranks)} (a global "
                         f"rank)")
    if rank == ctx.get_rank():
        raise ValueError(f"{what}: {name}={rank} is this rank; copy the tensor instead (tensor.copy_)")


def _tag(what: str, tag) -> None:
    if tag != 0:
        raise ValueError(f"{what}: tag={tag!r}: only tag 0 is supported (messages between two ranks are matched "
                         f"in the order they were sent)")


def send_launches(ctx, tensor, dst, group=None, tag=0, config=None) -> list:
    """The checked launch of :func:`send` (not launched)."""
    what = "send"
    config = _common.config_or_default(config)
    _tag(what, tag)
    ctx.team.check_tensor(what, "tensor", tensor, _common.MOVE_DTYPES, symmetric=False)
    _peer(ctx, what, "dst", dst, group)
    team = ctx.team
    pieces = max(1, triton.cdiv(tensor.numel(), config.block_size))
    return [bind(_send_kernel, (pieces,), tensor.reshape(-1), tensor.numel(), team.heap_start,
                 team.region("ccl.p2p_mail"), team.region("ccl.p2p_sent"), team.region("ccl.p2p_finished"), dst,
                 ctx.get_rank(), ctx.get_heap_bases(),
                 ELEMENT=tensor.element_size(), BLOCK=config.block_size)]


def recv_launches(ctx, tensor, src, group=None, tag=0, post=True, wait=True) -> list:
    """The checked launch of :func:`recv` (not launched): its post, its wait, or both."""
    what = "recv"
    _tag(what, tag)
    ctx.team.check_tensor(what, "tensor", tensor, _common.MOVE_DTYPES, symmetric=True)
    _peer(ctx, what, "src", src, group)
    team = ctx.team
    offset = tensor.data_ptr() - team.heap.base if tensor.numel() else 0
    return [bind(_recv_kernel, (1,), offset, tensor.nbytes, team.region("ccl.p2p_mail"),
                 team.region("ccl.p2p_received"), src, ctx.get_rank(),
                 ctx.get_heap_bases(), POST=post, WAIT=wait)]


def _launch(ctx, launches: list) -> list:
    for launch in launches:
        launch()
    ctx.team.diagnose_now_in_debug()
    return launches


def send(tensor, ctx, dst, group=None, tag=0, config=None) -> list:
    """Store ``tensor`` (contiguous, any device tensor) into the tensor global rank ``dst`` passes to its matching
    :func:`recv`; stream-ordered (later work on the stream runs after the message is in). ``group``: one both
    ranks belong to; ``tag``: 0; ``config.block_size``: elements per program. Returns the launch, bound.

    Example:
        >>> ctx.ccl.send(torch.arange(8.0, device=ctx.get_device()), dst=1)
    """
    return _launch(ctx, send_launches(ctx, tensor, dst, group, tag, config))


def recv(tensor, ctx, src, group=None, tag=0, config=None) -> list:
    """Receive rank ``src``'s next :func:`send` into ``tensor`` (on the heap, contiguous); stream-ordered: posts
    ``tensor`` to ``src`` and waits on the device until the message is in. The rest as for :func:`send`.

    Example:
        >>> x = ctx.zeros(8)
        >>> ctx.ccl.recv(x, src=0)
    """
    _common.config_or_default(config)
    return _launch(ctx, recv_launches(ctx, tensor, src, group, tag))


def sendrecv(send_tensor, recv_tensor, ctx, dst, src, group=None, tag=0, config=None) -> list:
    """:func:`send` ``send_tensor`` to ``dst`` while receiving ``src``'s message into ``recv_tensor``, the receive
    posted first: ranks that all call it (a ring, a pair swapping) never wait on each other.

    Example:
        >>> ctx.ccl.sendrecv(mine, theirs, dst=(rank + 1) % world, src=(rank - 1) % world)
    """
    return _launch(ctx, recv_launches(ctx, recv_tensor, src, group, tag, wait=False)
                   + send_launches(ctx, send_tensor, dst, group, tag, config)
                   + recv_launches(ctx, recv_tensor, src, group, tag, post=False))
