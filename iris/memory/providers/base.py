"""What every heap provider is: :class:`HeapProvider`, the facts of a job it judges (:class:`JobFacts`)
and its refusal (:class:`HeapProviderRefusal`); the providers and the choice are in :mod:`iris.memory.providers`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class HeapProviderRefusal(RuntimeError):
    """The heap provider cannot serve this job (raised by ``iris.iris()`` on every rank, before any allocation);
    the message says why and what to do instead.

    Example:
        >>> try:
        ...     ctx = iris.iris(heap="shmem")
        ... except iris.HeapProviderRefusal as refusal:
        ...     print(refusal)        # heap='shmem' needs torch.distributed: ...
    """


@dataclass(frozen=True)
class JobFacts:
    """What a provider's refusal depends on, gathered from every rank (so equal on every rank).

    Attributes:
        backend: "cuda", "hip" or "cpu".
        nodes: the node of each rank (:func:`iris.runtime.distributed.node_map`).
        devices: each rank's device, e.g. ``("cuda:0", "cuda:1")``.
        distributed: whether torch.distributed is initialized (the shmem engines bootstrap from it).
        engine: per rank, whether torch can run NVSHMEM/rocSHMEM there.
        mps_shares: per rank, its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (None: unset), which lets NVSHMEM put
            several ranks on one GPU under CUDA MPS.
    """

    backend: str
    nodes: tuple[int, ...]
    devices: tuple[str, ...]
    distributed: bool
    engine: tuple[bool, ...]
    mps_shares: tuple[float | None, ...] = ()

    @property
    def node_count(self) -> int:
        return len(set(self.nodes))


class HeapProvider(ABC):
    """One way to make the memory behind a symmetric heap."""

    #: the name ``heap=`` and IRIS_HEAP spell
    name: str = ""
    #: whether its heaps may compile the engine path (:mod:`iris.device.nvshmem`: ranks it maps no pointer
    #: to), whose block reads need staging slots in the heap's reserved tail (:func:`iris.host.team.reserved_layout`)
    reaches_by_engine: bool = False

    @abstractmethod
    def refusal(self, job: JobFacts) -> str | None:
        """Why this provider cannot serve ``job`` (a sentence naming what to change), or None."""

    @abstractmethod
    def create(self, backend, nbytes: int, device, comm, nodes: tuple[int, ...] | None = None):
        """Collective: ``nbytes`` of heap on every rank; returns a :class:`iris.runtime.HeapMemory`.
        ``nodes``: the node of each rank (None: one node)."""

    def spans_nodes_refusal(self, job: JobFacts, why: str) -> str | None:
        """The refusal of a job whose ranks run on more than one node, or None if one node holds them."""
        if job.node_count == 1:
            return None
        return (f"heap={self.name!r}: the {len(job.nodes)} ranks run on {job.node_count} nodes (node map "
                f"{job.nodes}, by rank); {why}")
