"""The team handle (``ctx.team``): what collectives and fused ops need of a context, and nothing more.

As torch's symmetric-memory handle: this rank, the world, the heap and its bases, the device barrier,
the groups' member tensors, and the scratch regions the collectives declare (:mod:`iris.memory.reserved`),
looked up by name; ``iris.ccl`` and ``iris.ops`` never reach into the context's private attributes.

Example:
    >>> team = ctx.team
    >>> members = team.participants(None)          # all ranks: .ranks, .index, .size, .tensor
    >>> arrivals, expected, _, _ = team.barrier.arguments(None)
    >>> team.region("ccl.locks").shape             # a collective's region: torch.Size([4096]), on the heap
"""

from __future__ import annotations

import dataclasses
import enum

import torch
import torch.distributed as dist

from iris import config
from iris.host import debug as debug_mode
from iris.device import nvshmem as engine
from iris.device.barrier import FUSED_PROGRAMS
from iris.host.barrier import DeviceBarrier
from iris.memory import reserved


def reserved_layout(world_size: int, engine_path: bool = False) -> reserved.ReservedLayout:
    """The heap's reserved tail of a team of ``world_size`` ranks (the same on every rank): the device
    barrier's arrivals, the regions the collectives declared, and last the engine's words; a heap whose
    provider may compile the engine path (``engine_path``: HeapProvider.reaches_by_engine) adds the
    engine's staging slots for block reads."""
    staging = [  # just below the scratch word, where iris.device.nvshmem finds them
        ("engine.staging", engine.STAGING_SLOTS.value * engine.STAGING_BYTES.value // 8, torch.int64),
        ("engine.staging_locks", engine.STAGING_SLOTS.value, torch.int32),
    ] if engine_path else []
    return reserved.ReservedLayout([
        ("barrier.arrivals", world_size * FUSED_PROGRAMS, torch.int64),  # [slot][rank], see iris.host.barrier
        *((r.name, r.elements(world_size), r.dtype, r.alignment) for r in reserved.declared() if r.on_heap),
        *staging,
        ("engine.scratch", 2, torch.int64),  # what engine calls that move nothing aim at (iris.device.nvshmem)
    ])


class Participants:
    """This rank's view of a group: the member ranks, its index, their device tensor; made once per group
    (:meth:`Team.participants`), so a collective copies nothing from the host and a CUDA graph can capture it."""

    def __init__(self, rank: int, ranks: tuple[int, ...], tensor: torch.Tensor):
        self.ranks = ranks
        self.index = ranks.index(rank)
        self.size = len(ranks)
        self.tensor = tensor


class Team:
    """One rank's handle on the job's ranks and their heaps; ``heap`` laid out with :func:`reserved_layout`,
    ``backend`` the runtime Backend, ``heap_bases`` every rank's heap base (int64, on the heap's device)."""

    def __init__(self, heap, rank: int, world_size: int, backend, heap_bases: torch.Tensor, comm=None):
        self.heap = heap
        self.comm = comm  # the host communicator (iris.runtime.distributed), for debug mode's cross-rank checks
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = heap.device
        self.heap_bases = heap_bases
        self.barrier = DeviceBarrier(heap.region("barrier.arrivals"), rank, world_size, heap_bases)
        # a heap that may reach a rank by the engine (a provider that compiles its path: HeapProvider.reaches_by_engine)
        self.heap_reaches_by_engine = "engine.staging_locks" in heap.layout
        if self.heap_reaches_by_engine:  # every staging slot free
            heap.region("engine.staging_locks").zero_()
        self.heap_start = heap.start  # the heap's first byte: a kernel addresses a heap offset from it
        self._regions = {}
        for region in reserved.declared():
            if not region.on_heap:
                self._regions[region.name] = torch.zeros(region.elements(world_size), dtype=region.dtype,
                                                         device=heap.device)
            elif region.name in heap.layout:  # a region declared after this heap was laid out is not in it
                self._regions[region.name] = heap.region(region.name)
                if region.zeroed:
                    self._regions[region.name].zero_()
        self._participants: dict[tuple[int, ...], Participants] = {}
        self.debug = False  # this context's debug mode (ctx.set_debug): cross-rank checks and diagnoses
        self.agreed_calls: set[tuple] = set()  # the calls every rank made alike (check_first_call)
        self.calls_compared = 0  # how many times a call was compared across ranks outside debug mode

    def region(self, name: str) -> torch.Tensor:
        """The scratch region ``name`` a collective declared (:class:`iris.memory.reserved.Region`): a view of
        the heap's reserved tail, or this rank's own tensor for a local one."""
        try:
            return self._regions[name]
        except KeyError:
            raise KeyError(f"no region {name!r} in this team; it has {sorted(self._regions)} (a collective "
                           "declares its regions when imported, before the context is made)") from None

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
    variant = getattr(value, "variant", None)  # a workspace names its variant
    return type(value).__name__ + (f"({variant})" if variant else "")


def check_agreement(team: Team, what: str, group, call: dict[str, str], timeout: float | None = None,
                    setting: str = "IRIS_WAIT_TIMEOUT", why: str = "checked because debug mode is on") -> None:
    """Raise ValueError on every member of ``group`` (naming each argument that differs) unless all made the same
    ``call`` (as :func:`describe` gives it); collective on the host. Over all ranks, a peer that does not come
    within ``timeout`` seconds (IRIS_WAIT_TIMEOUT unless given; ``setting`` names the variable that sets it) is
    named by WaitTimeoutError; ``why`` ends the message (what asked for the check)."""
    members = team.barrier.members_of(group)
    if group is None:
        timeout = config.wait_timeout_s() if timeout is None else timeout
        try:  # bounded: a peer that stopped calling collectives is named
            team.comm.meet(timeout, f"{what}'s argument check")
        except TimeoutError as error:
            raise debug_mode.WaitTimeoutError(f"{error}: one that stopped calling collectives, one far behind, or "
                                              f"one in another call ({setting}={timeout:g}; raise it if that rank "
                                              "only needs longer)") from None
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
                         f"({why})")


def describe_call(what: str, arguments: dict) -> dict[str, str]:
    """A call as ranks compare it: its name and each argument by :func:`describe` (no addresses)."""
    call = {"call": what}
    call.update((name, describe(value)) for name, value in arguments.items())
    return call


def check_call(team: Team, what: str, arguments: dict) -> None:
    """In debug mode, :func:`check_agreement` that every member of ``arguments["group"]`` made call ``what`` with
    these ``arguments``; nothing when debug mode is off.

    Example:
        >>> check_call(ctx.team, "all_reduce", {"output_tensor": out, "input_tensor": x, "group": None})
    """
    if team.debug:
        check_agreement(team, what, arguments.get("group"), describe_call(what, arguments))


def check_first_call(team: Team, what: str, arguments: dict) -> None:
    """The check of a call that has no plan yet (:class:`iris.host.replay.Plans`): in debug mode
    :func:`check_call`; otherwise, over all ranks, the first call of each distinct description (op, shapes, dtypes,
    settings; IRIS_AGREEMENT_CHECK) is compared across ranks once, so ranks that disagree get an error before
    their kernels wait on each other for ever, and a repeated call costs nothing. Every rank reaches the same
    first calls in the same order (the descriptions hold no addresses), so the comparison never waits on a rank
    that agreed. A call on a group (``arguments["group"]``) is compared in debug mode only.

    Example:
        >>> check_first_call(ctx.team, "all_reduce", {"output_tensor": out, "input_tensor": x, "group": None})
    """
    if team.debug:
        check_call(team, what, arguments)
        return
    if team.world_size == 1 or arguments.get("group") is not None:
        return
    timeout = config.agreement_check_s()
    if not timeout:
        return
    call = describe_call(what, arguments)
    signature = tuple(call.items())
    if signature in team.agreed_calls:
        return
    team.calls_compared += 1
    check_agreement(team, what, None, call, timeout, "IRIS_AGREEMENT_CHECK", "compared on the first call of each "
                    f"distinct call; IRIS_AGREEMENT_CHECK={timeout:g}")
    team.agreed_calls.add(signature)
