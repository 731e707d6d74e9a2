"""What every collective checks and does around its kernel."""

from __future__ import annotations

import torch

from iris.ccl.config import CollectiveConfig
from iris.device.barrier import FUSED_PROGRAMS
from iris.host.replay import BoundLaunch, bind, weakly_held

REDUCE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
MOVE_DTYPES = REDUCE_DTYPES + (torch.float8_e4m3fn, torch.float8_e5m2)


def config_or_default(config) -> CollectiveConfig:
    if config is None:
        return CollectiveConfig()
    if not isinstance(config, CollectiveConfig):
        raise TypeError(f"config must be an iris.ccl.Config, got {type(config).__name__}")
    return config


def run(ctx, group, async_op: bool, fuse: bool, kernel, programs: int, *args, fused_programs: int | None = None,
        **constexprs) -> list[BoundLaunch]:
    """Launch a collective's ``kernel`` (its ``programs`` pieces of work) inside the group's barriers; returns
    the launches, bound (``ctx.ccl`` replays them).

    ``fuse`` False: a barrier, the kernel over ``programs`` programs and, unless ``async_op``, a barrier (every
    member's buffers ready before, every write landed after). ``fuse`` True: one launch whose programs run the
    barriers themselves (:mod:`iris.device.barrier`), ``fused_programs`` of them (default ``programs``, at most
    FUSED_PROGRAMS), the same on every member. The barrier's state and ``programs`` follow ``args``; ``TRACE``
    is on while ``ctx.tracing`` is."""
    team = ctx.team
    barrier = team.barrier
    arrivals, expected, _, _ = barrier.arguments(group)
    launch = dict(FUSED=fuse, EXIT_BARRIER=fuse and not async_op, WORLD=ctx.get_num_ranks(),
                  BARRIER_BLOCK=barrier.block, TRACE=ctx.tracing.enabled, **constexprs)
    if fuse:
        grid = min(FUSED_PROGRAMS, max(1, programs if fused_programs is None else fused_programs))
        launches = [bind(kernel, (grid,), *args, arrivals, expected, programs, **launch)]
    else:
        launches = [barrier.launch(group)]
        if programs:
            launches.append(bind(kernel, (programs,), *args, arrivals, expected, programs, **launch))
        if not async_op:
            launches.append(barrier.launch(group))
    for launch in launches:
        launch()
    team.diagnose_now_in_debug()
    return launches


def fuse(config: CollectiveConfig, nbytes: int) -> bool:
    """Small messages (``Config.fused_bytes`` per rank or less) run as one fused launch."""
    return nbytes <= config.fused_bytes


def run_copies(ctx, what: str, members, group, async_op: bool, send, *tensors) -> list:
    """A copy-engine variant: ``send(*tensors)`` (queues this member's copies into the members' heaps) between the
    group's barriers (the second unless ``async_op``); returns the launches, run once here (``ctx.ccl`` replays
    them; ``tensors`` weakly held). Refused, before anything runs, where a member's heap is not mapped here."""
    team = ctx.team
    if not team.heap.maps(members.ranks):
        raise ValueError(f"{what}: the copies variant copies into every member's heap, and a member here is "
                         "reached only through the engine (another node); use another variant")
    launches = [team.barrier.launch(group), weakly_held(send, *tensors)]
    if not async_op:
        launches.append(team.barrier.launch(group))
    for each in launches:
        each()
    team.diagnose_now_in_debug()
    return launches
