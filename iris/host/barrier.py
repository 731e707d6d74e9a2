"""``Iris.device_barrier``: one small kernel on the current stream, so it overlaps queued work and replays
from a graph (its counters live in device memory)."""

from __future__ import annotations

import torch

from iris.device.barrier import FUSED_PROGRAMS
from iris.device.sync import barrier_kernel
from iris.host.replay import BoundLaunch, bind



def hashable(group):
    """``group`` as the caches key it: a list of ranks as a tuple, anything else as it is."""
    return tuple(group) if isinstance(group, list) else group

class DeviceBarrier:
    """Per-context state of the device barrier.

    Args:
        arrivals: ``world_size * FUSED_PROGRAMS`` int64 heap counters, at one offset on every rank.
        rank, world_size: this rank and the job's size.
        heap_bases: the int64 heap-bases tensor on the device.
    """

    def __init__(self, arrivals: torch.Tensor, rank: int, world_size: int, heap_bases: torch.Tensor):
        if arrivals.numel() != world_size * FUSED_PROGRAMS or arrivals.dtype != torch.int64:
            raise ValueError(f"the barrier needs {world_size * FUSED_PROGRAMS} int64 arrival counters, "
                             f"got {arrivals.numel()} {arrivals.dtype}")
        self._rank, self._world = rank, world_size
        self._heap_bases = heap_bases
        self._arrivals = arrivals
        self._arrivals.zero_()
        self._expected = torch.zeros(world_size * FUSED_PROGRAMS, dtype=torch.int64, device=arrivals.device)
        self._members: dict[tuple[int, ...], torch.Tensor] = {}
        self._ranks_by_group: dict = {}  # group (None: all) -> its checked global ranks
        self._launches: dict = {}  # group -> its BoundLaunch
        self._block = max(16, 1 << (world_size - 1).bit_length())

    def members_of(self, group) -> tuple[int, ...]:
        """The global ranks of ``group`` (None: all; a process group, or a tuple or list of ranks), checked once per
        group. (A list works; a tuple also lets a repeated call be remembered and replayed: its key must hash.)"""
        group = hashable(group)
        ranks = self._ranks_by_group.get(group)
        if ranks is None:
            ranks = self._ranks_by_group[group] = self._checked_ranks(group)
        return ranks

    def _checked_ranks(self, group) -> tuple[int, ...]:
        if group is None:
            return tuple(range(self._world))
        if isinstance(group, tuple):
            if len(set(group)) != len(group) or not all(isinstance(r, int) and 0 <= r < self._world for r in group):
                raise ValueError(f"team {group}: give distinct ranks of 0..{self._world - 1}")
            ranks = group
        else:
            ranks = self._process_group_ranks(group)
        if self._rank not in ranks:
            raise ValueError(f"device_barrier: rank {self._rank} is not in the group {list(ranks)}; "
                             "only its members may call it")
        return ranks

    @staticmethod
    def _process_group_ranks(group) -> tuple[int, ...]:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise ValueError("device_barrier(group=...) needs torch.distributed; this job has no process group "
                             "(pass group=None for all ranks)")
        return tuple(dist.get_process_group_ranks(group))

    def arguments(self, group=None) -> tuple:
        """(arrivals, expected, members, count) for ``barrier_round`` in a kernel of this group."""
        members = self.members_of(group)
        tensor = self._members.get(members)
        if tensor is None:  # once per group: graph capture copies nothing from the host
            tensor = torch.tensor(members, dtype=torch.int32, device=self._expected.device)
            self._members[members] = tensor
        return self._arrivals, self._expected, tensor, len(members)

    @property
    def block(self) -> int:
        return self._block

    def launch(self, group=None) -> BoundLaunch:
        """The barrier kernel of ``group``, bound once (see :mod:`iris.host.replay`)."""
        group = hashable(group)
        launch = self._launches.get(group)
        if launch is None:
            launch = self._launches[group] = bind(barrier_kernel, (1,), *self.arguments(group), self._rank,
                                                  self._heap_bases, BLOCK=self._block)
        return launch

    def __call__(self, group=None) -> None:
        self.launch(group)()
