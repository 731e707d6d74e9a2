"""Heap providers: where the memory behind a symmetric heap comes from, one small file each.

=========  ====================================================================================
provider   memory, and how a rank reaches its peers' heaps
=========  ====================================================================================
``ipc``    default: a device allocation mapped by CUDA/HIP IPC (POSIX shared memory on CPU); one node
``shmem``  an NVSHMEM/rocSHMEM allocation through torch symmetric memory; peers by ``nvshmem_ptr``
=========  ====================================================================================

Before allocating, the provider judges the job (:class:`JobFacts`, equal on every rank), so a refusal is
raised on every rank and none waits for a peer that gave up. Kernels see heap bases whatever the provider.

Example:
    >>> provider = create_provider(provider_name("shmem"))
    >>> provider.refusal(JobFacts("cpu", (0, 0), ("cpu", "cpu"), True, (False, False)))
    "heap='shmem' cannot run on the CPU backend: ..."
"""

from __future__ import annotations

from iris import config
from iris.memory.providers.base import HeapProvider, HeapProviderRefusal, JobFacts

PROVIDERS = ("ipc", "shmem")

__all__ = ["PROVIDERS", "HeapProvider", "HeapProviderRefusal", "JobFacts", "create_provider", "provider_name"]


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
