"""What every collective checks and does around its kernel."""

from __future__ import annotations

import torch

from iris.ccl.config import Config

# Kernel arguments that name ranks or the group's size: kept generic, so one compilation serves every
# rank and group (Triton would otherwise specialize on a value of 1).
GROUP_ARGS = ("count", "index", "cur")

REDUCE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
MOVE_DTYPES = REDUCE_DTYPES + (torch.float8_e4m3fn, torch.float8_e5m2)


class Participants:
    """This rank's view of a collective's group: the member ranks, its index, their device tensor.

    Made once per group and context (:func:`participants`): a collective then copies nothing from
    the host, so it can be captured in a CUDA graph.
    """

    def __init__(self, ctx, ranks: tuple[int, ...]):
        self.ranks = ranks
        self.index = ranks.index(ctx.get_rank())
        self.size = len(ranks)
        self.tensor = torch.tensor(ranks, dtype=torch.int32, device=ctx.get_device())


def participants(ctx, group) -> Participants:
    """The (cached) :class:`Participants` of ``group`` (None: all ranks); checks membership first."""
    ranks = ctx._device_barrier.members_of(group)  # checked: torch.distributed, membership
    cache = ctx.__dict__.setdefault("_ccl_participants", {})
    if ranks not in cache:
        cache[ranks] = Participants(ctx, ranks)
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
                         "allocate it with ctx.empty/ctx.zeros(...) or copy it in with ctx.as_symmetric(tensor)")


def config_or_default(config) -> Config:
    if config is None:
        return Config()
    if not isinstance(config, Config):
        raise TypeError(f"config must be an iris.ccl.Config, got {type(config).__name__}")
    return config


def begin(ctx, group) -> None:
    """A device barrier: every member's buffers are ready to be read and written."""
    ctx.device_barrier(group)


def end(ctx, group, async_op: bool) -> None:
    """A device barrier unless ``async_op``: on return every member's writes have landed."""
    if not async_op:
        ctx.device_barrier(group)
