"""The ``ipc`` heap provider (the default): the backend's own memory, mapped into every peer of the node.

On GPUs, one runtime allocation per rank shared through CUDA/HIP IPC handles
(:mod:`iris.runtime.ipc`); on the CPU backend, one POSIX shared-memory segment per rank
(:mod:`iris.runtime.cpu`). Either works between processes of one node only.
"""

from __future__ import annotations

from iris.memory.providers.base import HeapProvider, JobFacts


class IpcHeap(HeapProvider):
    name = "ipc"

    def refusal(self, job: JobFacts) -> str | None:
        return self.spans_nodes_refusal(
            job, "this heap reaches its peers by CUDA/HIP IPC or shared memory, which work inside one node only: "
                 "start one job per node (docs/multi-node.md says where the shmem heap stands)")

    def create(self, backend, nbytes: int, device, comm, nodes=None):
        return backend.create_heap(nbytes, device, comm)
