"""The team handle: what collectives and fused ops need of a context, and nothing more.

In the spirit of torch's symmetric-memory handle: this rank, the world, the heap and its bases,
the device barrier's state, the collectives' reserved regions (lock words, ring flags) and the
groups' member tensors. ``Iris`` composes a heap and a team (``ctx.team``); ``iris.ccl`` and
``iris.ops`` reach the job through it, never through the context's private attributes.

Example:
    >>> team = ctx.team
    >>> members = team.participants(None)          # all ranks: .ranks, .index, .size, .tensor
    >>> arrivals, expected, _, _ = team.barrier.arguments(None)
    >>> team.lock_words.shape                      # torch.Size([4096]), int32, on the heap
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect

import torch
import torch.distributed as dist
import triton.language as tl

from iris.host import debug as debug_mode
from iris.device import nvshmem as engine
from iris.device.barrier import FUSED_PROGRAMS
from iris.host.barrier import DeviceBarrier
from iris.memory.reserved import ReservedLayout

# all_reduce's spinlock words (int32) per rank: block b of an output is guarded by word b % LOCK_WORDS
# of its member.
LOCK_WORDS = tl.constexpr(4096)
# all_reduce's push variant (iris.ccl.all_reduce.push): the largest message it takes (bytes per rank), and
# the most programs of one call (each with its own flags and counts per peer). On 2 x H100, replayed from a
# graph, push with 1 MiB zones and 128 programs beat torch symmetric memory's two_shot at 128 KiB-1 MiB
# (7.2 against 8.5 us at 256 KiB, 10.0-10.2 against 11.5-11.9 at 1 MiB) where 32 programs trailed it from
# 512 KiB (docs/benchmarks.md); the zones cost 2 x world MiB of each rank's heap tail, as ll's do.
PUSH_BYTES = 1 << 20
PUSH_PROGRAMS = 128
# all_reduce's ll variant (the same module): the most 8-byte words of a message, each carrying the push's
# number beside one element (or two of 16 bits with IRIS_LL_PACK: 512 KiB of bfloat16), and its programs count
# like push's. With IRIS_LL_PACK off a message holds at most LL_UNPACKED elements (the landing zones ll was
# measured with on GPUs).
LL_WORDS = 128 << 10
LL_UNPACKED = 32 << 10
# send/recv's mailbox words per peer (iris.ccl.p2p: posted, offset, bytes, done)
P2P_WORDS = 4


def reserved_layout(world_size: int, engine_path: bool = False) -> ReservedLayout:
    """The heap's reserved tail of a team of ``world_size`` ranks (the same on every rank); a heap whose
    provider may compile the engine path (``engine_path``: HeapProvider.reaches_by_engine) adds the engine's
    staging slots for block reads."""
    staging = [  # just below the scratch word, where iris.device.nvshmem finds them
        ("engine.staging", engine.STAGING_SLOTS.value * engine.STAGING_BYTES.value // 8, torch.int64),
        ("engine.staging_locks", engine.STAGING_SLOTS.value, torch.int32),
    ] if engine_path else []
    return ReservedLayout([
        ("barrier.arrivals", world_size * FUSED_PROGRAMS, torch.int64),  # [slot][rank], see iris.host.barrier
        ("ccl.locks", LOCK_WORDS.value, torch.int32),
        ("ccl.ring_flags", FUSED_PROGRAMS, torch.int64),  # a program's counter: its left neighbour adds 1 per step
        # all_reduce's push variant (iris.ccl.all_reduce.push): [half][sender] landing zones and flags per program
        ("ccl.push_landing", 2 * world_size * PUSH_BYTES // 8, torch.int64),
        ("ccl.push_flags", 2 * world_size * PUSH_PROGRAMS, torch.int32),
        ("ccl.ll_landing", 2 * world_size * LL_WORDS, torch.int64),  # [half][sender] words: flag | element
        ("ccl.p2p_mail", world_size * P2P_WORDS, torch.int64),  # [peer][word], see iris.ccl.p2p
        ("ccl.a2av_table", 2 * world_size, torch.int64),  # all_to_all_v's (rows, first row) from each rank
        *staging,
        ("engine.scratch", 2, torch.int64),  # what engine calls that move nothing aim at (iris.device.nvshmem)
    ])


class Participants:
    """This rank's view of a group: the member ranks, its index, their device tensor.

    Made once per group and team (:meth:`Team.participants`): a collective then copies nothing from
    the host, so it can be captured in a CUDA graph.
    """

    def __init__(self, rank: int, ranks: tuple[int, ...], tensor: torch.Tensor):
        self.ranks = ranks
        self.index = ranks.index(rank)
        self.size = len(ranks)
        self.tensor = tensor


class Team:
    """One rank's handle on the job's ranks and their heaps (``ctx.team``); see :mod:`iris.host.team`.

    Args:
        heap: this rank's SymmetricHeap, laid out with :func:`reserved_layout`.
        rank, world_size: this rank and the job's size.
        backend: the runtime Backend (device count, synchronize).
        heap_bases: every rank's heap base, int64, on the heap's device.
    """

    def __init__(self, heap, rank: int, world_size: int, backend, heap_bases: torch.Tensor, comm=None):
        self.heap = heap
        self.comm = comm  # the host communicator (iris.runtime.distributed), for debug mode's cross-rank checks
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = heap.device
        self.heap_bases = heap_bases
        self.barrier = DeviceBarrier(heap.region("barrier.arrivals"), rank, world_size, heap_bases)
        self.lock_words = heap.region("ccl.locks")
        self.ring_flags = heap.region("ccl.ring_flags")
        self.lock_words.zero_()  # the reserved tail is not zeroed by the allocator
        self.ring_flags.zero_()
        self.ring_counts = torch.zeros_like(self.ring_flags)  # local: what each ring program has seen so far
        self.push_landing = heap.region("ccl.push_landing").view(torch.uint8)
        self.push_flags = heap.region("ccl.push_flags")
        self.push_flags.zero_()
        # a heap that may reach a rank by the engine (a provider that compiles its path: HeapProvider.reaches_by_engine)
        self.heap_reaches_by_engine = "engine.staging_locks" in heap.layout
        if self.heap_reaches_by_engine:  # every staging slot free
            heap.region("engine.staging_locks").zero_()
        # local: pushes sent to and received from each rank, per program ([sent | received][rank][program])
        self.push_counts = torch.zeros(2 * world_size * PUSH_PROGRAMS, dtype=torch.int32, device=heap.device)
        # the ll variant's own landing words and counts: its flags live in the words, so a word left by a push
        # call (raw data) must never be read as one of its words
        self.ll_landing = heap.region("ccl.ll_landing")
        self.ll_landing.zero_()  # flag 0: no push of the ll variant ever carries it
        self.ll_counts = torch.zeros_like(self.push_counts)
        # send/recv (iris.ccl.p2p): the mailbox, and local counts of the messages sent to and received from each
        # peer, and of a send's programs done; the heap's first byte, to address a posted tensor from its offset
        self.p2p_mail = heap.region("ccl.p2p_mail")
        self.p2p_mail.zero_()
        self.p2p_sent = torch.zeros(world_size, dtype=torch.int64, device=heap.device)
        self.p2p_received = torch.zeros_like(self.p2p_sent)
        self.p2p_finished = torch.zeros(world_size, dtype=torch.int32, device=heap.device)
        self.heap_start = heap.start
        self.a2av_table = heap.region("ccl.a2av_table")  # a call's members write their slots before it reads
        self._participants: dict[tuple[int, ...], Participants] = {}
        self.debug = False  # this context's debug mode (ctx.set_debug): cross-rank checks and diagnoses

    def participants(self, group) -> Participants:
        """The (cached) :class:`Participants` of ``group`` (None: all ranks); checks membership first."""
        ranks = self.barrier.members_of(group)  # checked: torch.distributed, membership
        found = self._participants.get(ranks)
        if found is None:  # the device barrier's own member tensor: the same ranks in the same order
            found = self._participants[ranks] = Participants(self.rank, ranks, self.barrier.arguments(group)[2])
        return found

    def check_tensor(self, what: str, name: str, tensor: torch.Tensor, dtypes, symmetric: bool,
                     rows: bool = False) -> None:
        """Errors before any launch: wrong type, dtype, device, layout, or not on the heap. ``rows``: a tensor
        whose rows are contiguous (the last dimension's stride 1) passes too, e.g. a buffer's leading columns."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{what}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.dtype not in dtypes:
            names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
            raise TypeError(f"{what}: {name} has dtype {str(tensor.dtype).removeprefix('torch.')}; supported: {names}")
        if tensor.device != self.device:
            raise ValueError(f"{what}: {name} is on {tensor.device}, this rank's heap is on {self.device}")
        if not (tensor.is_contiguous() or (rows and tensor.dim() and tensor.stride(-1) == 1)):
            raise ValueError(f"{what}: {name} must be contiguous{' in its rows' if rows else ''} (call "
                             f".contiguous() on it first)")
        if symmetric and tensor.numel() and not self.heap.contains(tensor):  # an empty tensor is never reached
            raise ValueError(f"{what}: {name} is not on the symmetric heap, so other ranks cannot reach it; "
                             "allocate it with ctx.empty/ctx.zeros(...), or copy it into a heap buffer made once "
                             "(stage = ctx.empty_like(tensor); stage.copy_(tensor)) and pass that")

    def raise_if_a_wait_timed_out(self) -> None:
        """In debug mode, raise what this rank's kernels reported (a wait that gave up, a bad access)."""
        if self.debug:
            debug_mode.raise_if_reported(self.rank, self.heap)

    def diagnose_now_in_debug(self) -> None:
        """In debug mode, wait for this device and raise what its kernels reported: the host trades its
        freedom for an immediate diagnosis (device_barrier, collectives and fused ops call this after launching)."""
        if self.debug:
            self.backend.synchronize(self.device)
            self.raise_if_a_wait_timed_out()


def describe(value) -> str:
    """How a collective's argument is compared across ranks: a tensor by shape and dtype (not address),
    a group by its ranks, a config by its fields, anything else without a readable value by its type."""
    if isinstance(value, torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if value is None or isinstance(value, (bool, int, float, str, enum.Enum, torch.dtype)):
        return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return repr(value)
    if dist.is_available() and isinstance(value, dist.ProcessGroup):
        return f"group of ranks {dist.get_process_group_ranks(value)}"
    variant = getattr(value, "variant", None)  # an all_reduce workspace
    return type(value).__name__ + (f"({variant})" if variant else "")


def check_agreement(team: Team, what: str, group, call: dict[str, str]) -> None:
    """Debug mode: raise on every member of ``group`` unless all of them made the same ``call``
    (collective over the group's members, on the host; ``call`` as :func:`describe` gives it).

    Raises:
        ValueError: naming each argument that differs and what every member passed.
    """
    members = team.barrier.members_of(group)
    if group is None:
        calls = team.comm.all_gather_object(call)
    else:
        calls = [None] * len(members)
        dist.all_gather_object(calls, call, group=group)
    names = list(dict.fromkeys(name for c in calls for name in c))
    differing = [name for name in names if len({c.get(name) for c in calls}) > 1]
    if differing:
        lines = "; ".join(f"{name}: " + ", ".join(f"rank {r} {c.get(name, '(not called)')}"
                                                  for r, c in zip(members, calls)) for name in differing)
        raise ValueError(f"{what}: the ranks of the group called it differently ({lines}); every member must make "
                         "the same collective calls in the same order, with the same shapes, dtypes and settings "
                         "(checked because debug mode is on)")


def check_call(team: Team, what: str, arguments: dict) -> None:
    """In debug mode, check that every member of the call's group made the same call ``what`` with these
    ``arguments`` (by name, as :func:`describe` compares them; ``group`` among them: the members), by
    :func:`check_agreement`; nothing when debug mode is off.

    Example:
        >>> check_call(ctx.team, "all_reduce", {"output_tensor": out, "input_tensor": x, "group": None})
    """
    if team.debug:
        call = {"call": what}
        call.update((name, describe(value)) for name, value in arguments.items())
        check_agreement(team, what, arguments.get("group"), call)


def checked_across_ranks(method):
    """Decorate a ``ctx.ops`` method: in debug mode, first :func:`check_call` with the call's arguments;
    nothing else is done when debug mode is off. (``ctx.ccl``'s methods, whose host path is most of a small
    collective's time, check where a call is not replayed instead: in debug mode none is.)

    Example:
        >>> class Ops:
        ...     @checked_across_ranks
        ...     def matmul_all_reduce(self, output, A, B, bias=None, ...): ...
    """
    signature = inspect.signature(method)

    @functools.wraps(method)
    def checked(self, *args, **kwargs):
        if self._ctx.team.debug:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            check_call(self._ctx.team, method.__name__,
                       {name: value for name, value in bound.arguments.items() if name != "self"})
        return method(self, *args, **kwargs)

    return checked
