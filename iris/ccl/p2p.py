"""Point to point: ``send``, ``recv`` and ``sendrecv`` between two ranks, on the device, no host round trip.

A message goes straight from the sender's tensor into the receiver's, with no staging copy, by
rendezvous: ``recv`` posts where its tensor is (its offset on the receiver's heap and its size) into a
mailbox on the sender and, once the sender says the message is in, returns; ``send`` waits for that post,
stores its tensor into the receiver's and signals it. Every count lives on the device (each rank counts
the messages it sent to and received from each peer), so the calls can be captured in a CUDA graph and
replayed, and nothing waits on the host. Messages between two ranks are matched in the order they were
sent.

Because ``send`` waits for the matching ``recv`` to be posted (as MPI's synchronous send does), two ranks
that send to each other both call ``sendrecv`` (which posts its receive first), or order their calls
(one sends first, the other receives first). In debug mode a wait that lasts past IRIS_WAIT_TIMEOUT is
reported with the rank and the word it waited on, instead of hanging.

Where each tensor lives: the received tensor on the symmetric heap (the sender stores into it); the sent
one may be any device tensor of the sender. Both have the same dtype and number of elements (a receiving
tensor with fewer takes what fits).

Example:
    >>> x = ctx.zeros(1024)
    >>> if ctx.get_rank() == 0:
    ...     ctx.ccl.send(torch.ones(1024, device=ctx.get_device()), dst=1)
    ... elif ctx.get_rank() == 1:
    ...     ctx.ccl.recv(x, src=0)                     # x is all ones
    >>> world, rank = ctx.get_num_ranks(), ctx.get_rank()
    >>> ring = ctx.zeros(1024)
    >>> ctx.ccl.sendrecv(x, ring, dst=(rank + 1) % world, src=(rank - 1) % world)
"""

from __future__ import annotations

import triton
import triton.language as tl

from iris.ccl import _common
from iris.device import rma, sync
from iris.host.replay import bind
from iris.host.team import P2P_WORDS

# A rank's mailbox holds these int64 words per peer (the heap's reserved region "ccl.p2p_mail", [peer][word]).
# On the sender, the peer's posts: how many receives it posted, and the last one's tensor (offset on the
# peer's heap, bytes). On the receiver, the sender's count of messages stored into its tensors.
POSTED = tl.constexpr(0)
OFFSET = tl.constexpr(1)
NBYTES = tl.constexpr(2)
DONE = tl.constexpr(3)
WORDS = tl.constexpr(P2P_WORDS)


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
    return [bind(_send_kernel, (pieces,), tensor.reshape(-1), tensor.numel(), team.heap_start, team.p2p_mail,
                 team.p2p_sent, team.p2p_finished, dst, ctx.get_rank(), ctx.get_heap_bases(),
                 ELEMENT=tensor.element_size(), BLOCK=config.block_size)]


def recv_launches(ctx, tensor, src, group=None, tag=0, post=True, wait=True) -> list:
    """The checked launch of :func:`recv` (not launched): its post, its wait, or both."""
    what = "recv"
    _tag(what, tag)
    ctx.team.check_tensor(what, "tensor", tensor, _common.MOVE_DTYPES, symmetric=True)
    _peer(ctx, what, "src", src, group)
    team = ctx.team
    offset = tensor.data_ptr() - team.heap.base if tensor.numel() else 0
    return [bind(_recv_kernel, (1,), offset, tensor.nbytes, team.p2p_mail, team.p2p_received, src, ctx.get_rank(),
                 ctx.get_heap_bases(), POST=post, WAIT=wait)]


def _launch(ctx, launches: list) -> list:
    for launch in launches:
        launch()
    ctx.team.diagnose_now_in_debug()
    return launches


def send(tensor, ctx, dst, group=None, tag=0, config=None) -> list:
    """Store ``tensor`` into the tensor rank ``dst`` passes to its matching :func:`recv`.

    Stream-ordered: the launch waits on the device until ``dst`` has posted its receive, so the sender's
    later work on the stream runs after the message is in ``dst``'s tensor (``tensor`` may then change).

    Args:
        tensor: any device tensor of this rank, contiguous; the receiver's has its dtype and size.
        ctx: the Iris context.
        dst: the global rank that receives (a member of ``group``, not this rank).
        group: a torch.distributed group both ranks belong to, or None.
        tag: 0 (messages between two ranks are matched in order).
        config: an :class:`iris.ccl.Config` (``block_size``: elements per program).

    Returns:
        The launch, bound (``ctx.ccl`` keeps it to replay the call).

    Example:
        >>> ctx.ccl.send(torch.arange(8.0, device=ctx.get_device()), dst=1)
    """
    return _launch(ctx, send_launches(ctx, tensor, dst, group, tag, config))


def recv(tensor, ctx, src, group=None, tag=0, config=None) -> list:
    """Receive rank ``src``'s next :func:`send` into ``tensor`` (on the symmetric heap).

    Stream-ordered: the launch posts ``tensor`` to ``src`` and waits on the device until the message is in.

    Args:
        tensor: on the symmetric heap, contiguous; the sender's has its dtype and size.
        ctx, group, tag, config: as for :func:`send`.
        src: the global rank that sends (a member of ``group``, not this rank).

    Example:
        >>> x = ctx.zeros(8)
        >>> ctx.ccl.recv(x, src=0)
    """
    _common.config_or_default(config)
    return _launch(ctx, recv_launches(ctx, tensor, src, group, tag))


def sendrecv(send_tensor, recv_tensor, ctx, dst, src, group=None, tag=0, config=None) -> list:
    """:func:`send` ``send_tensor`` to ``dst`` while receiving ``src``'s message into ``recv_tensor``: the receive
    is posted first, so ranks that all call sendrecv (a ring, a pair swapping) never wait on each other.

    Example:
        >>> world, rank = ctx.get_num_ranks(), ctx.get_rank()
        >>> mine, theirs = ctx.full((64,), float(rank)), ctx.zeros(64)
        >>> ctx.ccl.sendrecv(mine, theirs, dst=(rank + 1) % world, src=(rank - 1) % world)
    """
    return _launch(ctx, recv_launches(ctx, recv_tensor, src, group, tag, wait=False)
                   + send_launches(ctx, send_tensor, dst, group, tag, config)
                   + recv_launches(ctx, recv_tensor, src, group, tag, post=False))
