"""Heap providers: where the memory behind a symmetric heap comes from, one small file each.

=========  ====================================================================================
provider   memory, and how a rank reaches its peers' heaps
=========  ====================================================================================
``ipc``    the backend's own (default): one device allocation mapped into every peer by CUDA/HIP
           IPC, or one POSIX shared-memory segment per rank on the CPU backend; inside one node
``shmem``  one NVSHMEM (NVIDIA) or rocSHMEM (AMD) symmetric allocation, made through torch's
           symmetric memory with that backend; peers of the node are reached by the pointers the
           engine maps (``nvshmem_ptr``), as with ``ipc``
=========  ====================================================================================

A context takes ``iris.iris(..., heap=...)``, else ``IRIS_HEAP``, else ``ipc``. Before any memory is
allocated, the provider looks at the job (:class:`JobFacts`, the same on every rank) and says why it
cannot serve it, if it cannot: every rank then raises the same error, and no rank waits for a peer
that gave up. Device code is the same whatever the provider: a kernel sees heap bases.

Example:
    >>> provider = create_provider(provider_name("shmem"))
    >>> provider.refusal(JobFacts("cpu", (0, 0), ("cpu", "cpu"), True, (False, False)))
    "heap='shmem' cannot run on the CPU backend: ..."
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from iris import config

PROVIDERS = ("ipc", "shmem")


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
        nodes: the node of each rank (:func:`iris.distributed.node_map`).
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
    #: to), whose block reads need staging slots in the heap's reserved tail (:func:`iris.team.reserved_layout`)
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


def provider_name(requested: str | None) -> str:
    """The provider a context takes: ``requested`` (``heap=``), else IRIS_HEAP, else ``ipc``.

    Raises:
        ValueError: the name is not a provider.
    """
    if requested is not None:
        name, source = requested, f"heap={requested!r}"
    else:
        name = config.heap_request()
        source = f"IRIS_HEAP={name!r}"
        if not name:
            return "ipc"
    if not isinstance(name, str) or name.strip().lower() not in PROVIDERS:
        raise ValueError(f"{source} is not a heap provider; use one of {', '.join(PROVIDERS)}")
    return name.strip().lower()


def create_provider(name: str) -> HeapProvider:
    """The provider called ``name`` (imports only its module)."""
    if name == "ipc":
        from iris.memory.providers.ipc import IpcHeap

        return IpcHeap()
    if name == "shmem":
        from iris.memory.providers.shmem import ShmemHeap

        return ShmemHeap()
    raise ValueError(f"unknown heap provider {name!r}; use one of {', '.join(PROVIDERS)}")
