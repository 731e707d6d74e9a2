"""The heap provider interface, the job facts it judges and its refusal."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


class HeapProviderRefusal(RuntimeError):
    """The heap provider cannot serve this job; raised on every rank before any allocation, saying what to do.

    Example:
        >>> try:
        ...     ctx = iris.iris(heap="shmem")
        ... except iris.HeapProviderRefusal as refusal:
        ...     print(refusal)        # heap='shmem' needs torch.distributed: ...
    """


@dataclass(frozen=True)
class JobFacts:
    """What a provider's refusal depends on, gathered from every rank so every rank decides alike.

    Attributes:
        backend: "cuda", "hip" or "cpu".
        nodes: the node of each rank (:func:`iris.runtime.distributed.node_map`).
        devices: each rank's device, e.g. ``("cuda:0", "cuda:1")``.
        distributed: whether torch.distributed is initialized (the shmem engines bootstrap from it).
        engine: per rank, whether torch can run NVSHMEM/rocSHMEM there.
        mps_shares: per rank, its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (None: unset).
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
    #: whether its heaps may compile the engine path (:mod:`iris.device.nvshmem`), which needs staging slots
    reaches_by_engine: bool = False

    @abstractmethod
    def refusal(self, job: JobFacts) -> str | None:
        """Why this provider cannot serve ``job`` (a sentence naming what to change), or None."""

    @abstractmethod
    def create(self, backend, nbytes: int, device, comm, nodes: tuple[int, ...] | None = None,
               on_demand: bool = False):
        """Collective: ``nbytes`` of heap on every rank (``nodes``: each rank's node), as a ``HeapMemory``;
        ``on_demand``: backed as the allocations grow, where this provider's memory can be."""

    def spans_nodes_refusal(self, job: JobFacts, why: str) -> str | None:
        """The refusal of a job spanning nodes, or None on one node."""
        if job.node_count == 1:
            return None
        return (f"heap={self.name!r}: the {len(job.nodes)} ranks run on {job.node_count} nodes (node map "
                f"{job.nodes}, by rank); {why}")
