"""The default ``ipc`` heap provider: the backend's own memory (CUDA/HIP IPC or POSIX shm), one node only."""

from __future__ import annotations

from iris.memory.providers.base import HeapProvider, JobFacts


class IpcHeap(HeapProvider):
    name = "ipc"

    def refusal(self, job: JobFacts) -> str | None:
        return self.spans_nodes_refusal(
            job, "this heap reaches its peers by CUDA/HIP IPC or shared memory, which work inside one node only: "
                 "start one job per node (docs/multi-node.md says where the shmem heap stands)")

    def create(self, backend, nbytes: int, device, comm, nodes=None, on_demand=False):
        return backend.create_heap(nbytes, device, comm, on_demand=on_demand)
