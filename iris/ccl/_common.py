"""What every collective checks and does around its kernel."""

from __future__ import annotations

import torch
import triton.language as tl

from iris.ccl.config import Config
from iris import device_barrier
from iris.device_barrier import FUSED_PROGRAMS
from iris.kernel_launch import bind

# Kernel arguments that name ranks or the group's size: kept generic, so one compilation serves every
# rank and group (Triton would otherwise specialize on a value of 1).
GROUP_ARGS = ("count", "index", "cur")

# The spinlock all_reduce's lock words (int32), per rank, in the heap's reserved tail after the device
# barrier's counters; block b of an output is guarded by word b % LOCK_WORDS of its member.
LOCK_WORDS = tl.constexpr(4096)


def reserved_bytes() -> int:
    """Heap bytes the collectives reserve past the device barrier's: the lock words, the ring flags."""
    return 4 * LOCK_WORDS.value + 8 * FUSED_PROGRAMS


def lock_words(ctx) -> torch.Tensor:
    """This rank's lock words (zeroed when the context is made, see :class:`iris.ccl.CCL`)."""
    return ctx.heap.internal(device_barrier.reserved_bytes(ctx.get_num_ranks()), LOCK_WORDS.value, torch.int32)


def ring_flags(ctx) -> torch.Tensor:
    """The ring all_reduce's flags (int64), one per fused program, after the lock words."""
    offset = device_barrier.reserved_bytes(ctx.get_num_ranks()) + 4 * LOCK_WORDS.value
    return ctx.heap.internal(offset, FUSED_PROGRAMS, torch.int64)


REDUCE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
MOVE_DTYPES = REDUCE_DTYPES + (torch.float8_e4m3fn, torch.float8_e5m2)


class Participants:
    """This rank's view of a collective's group: the member ranks, its index, their device tensor.

    Made once per group and context (:func:`participants`): a collective then copies nothing from
    the host, so it can be captured in a CUDA graph.
    """

    def __init__(self, ctx, ranks: tuple[int, ...], tensor: torch.Tensor):
        self.ranks = ranks
        self.index = ranks.index(ctx.get_rank())
        self.size = len(ranks)
        self.tensor = tensor


def participants(ctx, group) -> Participants:
    """The (cached) :class:`Participants` of ``group`` (None: all ranks); checks membership first."""
    ranks = ctx._device_barrier.members_of(group)  # checked: torch.distributed, membership
    cache = ctx.ccl._participants
    if ranks not in cache:  # the device barrier's own member tensor: the same ranks in the same order
        cache[ranks] = Participants(ctx, ranks, ctx._device_barrier.arguments(group)[2])
    return cache[ranks]


def check_tensor(ctx, what: str, name: str, tensor: torch.Tensor, dtypes, symmetric: bool) -> None:
    """Errors before any launch: wrong type, dtype, device, layout, or not on the heap."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{what}: {name} must be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.dtype not in dtypes:
        names = ", ".join(str(d).removeprefix("torch.") for d in dtypes)
        raise TypeError(f"{what}: {name} has dtype {str(tensor.dtype).removeprefix('torch.')}; supported: {names}")
    if tensor.device != ctx.get_device():
        raise ValueError(f"{what}: {name} is on {tensor.device}, this rank's heap is on {ctx.get_device()}")
    if not tensor.is_contiguous():
        raise ValueError(f"{what}: {name} must be contiguous (call .contiguous() on it first)")
    if symmetric and tensor.numel() and not ctx.is_symmetric(tensor):  # an empty tensor is never reached
        raise ValueError(f"{what}: {name} is not on the symmetric heap, so other ranks cannot reach it; "
                         "allocate it with ctx.empty/ctx.zeros(...), or copy it into a heap buffer made once "
                         "(stage = ctx.empty_like(tensor); stage.copy_(tensor)) and pass that")


def config_or_default(config) -> Config:
    if config is None:
        return Config()
    if not isinstance(config, Config):
        raise TypeError(f"config must be an iris.ccl.Config, got {type(config).__name__}")
    return config


def run(ctx, group, async_op: bool, fuse: bool, kernel, programs: int, *args, fused_programs: int | None = None,
        **constexprs) -> None:
    """Launch a collective's ``kernel`` (its ``programs`` pieces of work) inside the group's barriers.

    ``fuse`` False: ``device_barrier``, the kernel over ``programs`` programs, and (unless
    ``async_op``) ``device_barrier`` again: every member's buffers are ready before, and every
    write has landed after. ``fuse`` True: one launch whose programs run the barriers themselves
    and share the pieces (see :mod:`iris.ccl._device`): ``fused_programs`` of them, the same on
    every member (default: ``programs``), at most FUSED_PROGRAMS. ``args`` end with ``cur,
    heap_bases``-style arguments of the kernel; the barrier's state and ``programs`` follow them.

    The launches are bound (:mod:`iris.kernel_launch`) and handed to ``ctx.ccl``, which replays
    them when the same collective is called again with the same tensors.
    """
    barrier = ctx._device_barrier
    arrivals, expected, _, _ = barrier.arguments(group)
    launch = dict(FUSED=fuse, EXIT_BARRIER=fuse and not async_op, WORLD=ctx.get_num_ranks(),
                  BARRIER_BLOCK=barrier.block, **constexprs)
    if fuse:
        grid = min(FUSED_PROGRAMS, max(1, programs if fused_programs is None else fused_programs))
        launches = [bind(kernel, (grid,), *args, arrivals, expected, programs, **launch)]
    else:
        launches = [barrier.launch(group)]
        if programs:
            launches.append(bind(kernel, (programs,), *args, arrivals, expected, programs, **launch))
        if not async_op:
            launches.append(barrier.launch(group))
    ctx.ccl._launch(launches)


def fuse(config: Config, nbytes: int) -> bool:
    """Small messages (``Config.fused_bytes`` per rank or less) run as one fused launch."""
    return nbytes <= config.fused_bytes
