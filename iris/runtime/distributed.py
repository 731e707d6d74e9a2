"""Bootstrap: who am I, how many are we, and how do we exchange small objects.

``init_distributed`` takes, in order: an initialized torch.distributed group; torchrun-style variables
(RANK, WORLD_SIZE, ...; ``iris run`` sets them); an MPI launch through mpi4py; else a world of one.
"""

from __future__ import annotations

import atexit
import datetime
import re
import socket
import time
from typing import Any

import torch.distributed as dist

from iris import config



class Communicator:
    """Host-side exchange between ranks (small objects only)."""

    rank: int = 0
    world_size: int = 1

    def all_gather_object(self, obj: Any) -> list:
        raise NotImplementedError

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        raise NotImplementedError

    def barrier(self, group=None) -> None:
        raise NotImplementedError

    def meet(self, timeout_s: float, what: str) -> None:
        """A barrier that gives up after ``timeout_s``: TimeoutError naming ``what`` and, where the transport can
        tell, the ranks that did not come. Example: ``comm.meet(10.0, "all_reduce's argument check")``."""
        raise NotImplementedError


class SoloCommunicator(Communicator):
    """A world of one: every collective is the identity."""

    def all_gather_object(self, obj):
        return [obj]

    def broadcast_object(self, obj, src=0):
        _check_src(src, 1)
        return obj

    def barrier(self, group=None):
        return None

    def meet(self, timeout_s, what):
        return None


_host_group = None


def _gloo_group():
    """A gloo group over all ranks for Iris's host traffic: NCCL refuses ranks sharing a GPU."""
    global _host_group
    if _host_group is None:
        _host_group = dist.new_group(backend="gloo")
    return _host_group


class TorchCommunicator(Communicator):
    """Exchange through torch.distributed (all ranks of the default group, over gloo)."""

    def __init__(self):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._group = _gloo_group()

    def all_gather_object(self, obj):
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def broadcast_object(self, obj, src=0):
        _check_src(src, self.world_size)
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self._group)
        return box[0]

    def barrier(self, group=None):
        dist.barrier(group=self._group if group is None else group)

    def meet(self, timeout_s, what):
        try:  # gloo's monitored barrier: rank 0 names every rank that did not answer in time
            dist.monitored_barrier(group=self._group, timeout=datetime.timedelta(seconds=timeout_s),
                                   wait_all_ranks=True)
        except RuntimeError as error:
            missing = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", str(error))
            who = f"rank {missing[1].strip()} did not arrive" if missing else "not every rank arrived"
            raise TimeoutError(f"{what}: {who} within {timeout_s:g} s") from None


class MpiCommunicator(Communicator):
    """Exchange through MPI_COMM_WORLD (mpi4py)."""

    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise RuntimeError(
                f"this process was started by an MPI launcher but mpi4py cannot be loaded ({exc}); "
                "run `pip install iris[mpi]` against an MPI library such as Open MPI or MPICH"
            ) from exc
        self._comm = MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.world_size = self._comm.Get_size()

    def all_gather_object(self, obj):
        return self._comm.allgather(obj)

    def broadcast_object(self, obj, src=0):
        _check_src(src, self.world_size)
        return self._comm.bcast(obj, root=src)

    def barrier(self, group=None):
        if group is not None:
            raise ValueError("barrier(group=...) needs torch.distributed; this job was bootstrapped through MPI")
        self._comm.Barrier()

    def meet(self, timeout_s, what):
        request, deadline = self._comm.Ibarrier(), time.monotonic() + timeout_s
        while not request.Test():  # MPI cannot say who is missing, only that someone is
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: the ranks did not all arrive within {timeout_s:g} s")
            time.sleep(0.001)


def node_map(comm: Communicator) -> tuple[int, ...]:
    """Collective: each rank's node, by host name (IRIS_NODE_MAP overrides it); IPC reaches one node only.

    Example:
        >>> node_map(comm)      # two hosts, two ranks each
        (0, 0, 1, 1)
    """
    forced = config.node_map(comm.world_size)
    if forced is not None:
        return forced
    hosts = comm.all_gather_object(socket.gethostname())
    numbers = {}
    return tuple(numbers.setdefault(host, len(numbers)) for host in hosts)


def _check_src(src, world_size):
    if not isinstance(src, int) or not 0 <= src < world_size:
        raise ValueError(f"src={src!r} is not a rank of this world of {world_size}")


def job_world_size() -> int:
    """How many ranks this job has, before any Iris context exists (to size a heap, say).

    Example:
        >>> ctx = iris.iris(heap_size=job_world_size() * (64 << 20))
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return config.launcher_world_size() or 1


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def init_distributed(backend, device_for_rank=None) -> Communicator:
    """Find or create the job's communicator (see the module docstring).

    Args:
        backend: the Iris backend, whose ``device_for`` places each rank.
        device_for_rank: callable(rank) -> torch.device, in place of ``backend.device_for``.

    Example:
        >>> comm = init_distributed(runtime.get_backend())
    """
    device_for_rank = device_for_rank or backend.device_for
    if dist.is_available() and dist.is_initialized():
        return TorchCommunicator()
    launched = config.launcher_rank_and_world()
    if launched:
        rank, world = launched
        device = device_for_rank(rank)
        shares_devices = len({device_for_rank(r) for r in range(world)}) < world
        if device.type == "cpu" or shares_devices:
            # NCCL refuses several ranks per GPU.
            dist.init_process_group(backend="gloo", rank=rank, world_size=world)
        else:
            dist.init_process_group(backend="cpu:gloo,cuda:nccl", rank=rank, world_size=world, device_id=device)
        # Ended before interpreter teardown, where gloo's threads can abort the process.
        atexit.register(_destroy_process_group)
        return TorchCommunicator()
    if config.launched_by_mpi():
        return MpiCommunicator()
    return SoloCommunicator()
