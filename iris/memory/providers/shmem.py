"""The ``shmem`` heap provider: one NVSHMEM (NVIDIA) / rocSHMEM (AMD) symmetric allocation per job.

The allocation is made through torch's symmetric memory with its shmem backend
(``torch.distributed._symmetric_memory``: ``set_backend("NVSHMEM")``, ``empty``, ``rendezvous``),
which bootstraps the engine from the torch.distributed group and ships the library with torch's
CUDA wheels; Iris adds no dependency and no transport of its own. Peers of the node are reached
by the pointers the engine maps (the handle's ``buffer_ptrs``, ``nvshmem_ptr``), so every device
op works on this heap as on the ``ipc`` one. A peer on another node has no such pointer; the
device path toward it (put/get/signal through the engine) is not built yet, so a job across nodes
is refused before any allocation (docs/multi-node.md).

Why through torch and not nvshmem4py: torch is already the one dependency every Iris rank loads,
its wheels carry the engine on both vendors (NVSHMEM; rocSHMEM on ROCm builds), and it bootstraps
the engine from the process group Iris already has, under torchrun, ``iris run`` or Slurm alike.
"""

from __future__ import annotations

import torch

from iris import config
from iris.capabilities import limitation
from iris.memory.providers import HeapProvider, JobFacts
from iris.runtime.base import HeapMemory, raise_if_any_rank_failed

#: torch names its shmem backend "NVSHMEM" on CUDA and ROCm builds alike (rocSHMEM underneath on ROCm)
TORCH_BACKEND = "NVSHMEM"


def engine_available() -> bool:
    """Whether torch can run NVSHMEM/rocSHMEM in this process (a build with it, a GPU it accepts)."""
    try:
        from torch.distributed import _symmetric_memory as symm_mem

        return bool(symm_mem.is_nvshmem_available())
    except (ImportError, RuntimeError):
        return False


def _shared_devices(devices: tuple[str, ...]) -> tuple[int, int] | None:
    first = {}
    for rank, device in enumerate(devices):
        if device in first:
            return first[device], rank
        first[device] = rank
    return None


def _use_torch_shmem_backend(symm_mem, device) -> None:
    """Point torch's symmetric memory at its shmem engine (once per process; it cannot change later)."""
    try:
        current = symm_mem.get_backend(device)
    except RuntimeError:
        current = None
    if current == TORCH_BACKEND:
        return
    try:
        symm_mem.set_backend(TORCH_BACKEND)
    except RuntimeError as error:
        raise RuntimeError(f"torch's symmetric memory on {device} already uses its {current} backend in this "
                           f"process, and it cannot change once it allocated ({error}); make the Iris context "
                           "with heap='shmem' before any other symmetric-memory allocation") from error


class ShmemHeap(HeapProvider):
    name = "shmem"

    def refusal(self, job: JobFacts) -> str | None:
        gap = limitation(job.backend, "shmem_heap")
        if gap:
            return f"heap='shmem' cannot run on the {job.backend.upper()} backend: {gap}. Use heap='ipc' (the default)"
        if not job.distributed:
            return ("heap='shmem' needs torch.distributed: NVSHMEM/rocSHMEM bootstrap from its group. Start the "
                    "job with `iris run`, torchrun or srun with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, or call "
                    "torch.distributed.init_process_group() before iris.iris()")
        missing = [rank for rank, ok in enumerate(job.engine) if not ok]
        if missing:
            return (f"heap='shmem': torch cannot run NVSHMEM/rocSHMEM on rank {', '.join(map(str, missing))} "
                    "(torch.distributed._symmetric_memory.is_nvshmem_available() is False: a torch build "
                    "without it, or its library not found); use heap='ipc' inside one node")
        shared = _shared_devices(job.devices)
        if shared:
            a, b = shared
            return (f"heap='shmem' runs one rank per GPU, and ranks {a} and {b} share {job.devices[a]} "
                    "(IRIS_SIMULATION?): NVSHMEM refuses several processes per GPU outside CUDA MPS ('limited "
                    "MPG'); use heap='ipc' to put several ranks on one GPU")
        return self.spans_nodes_refusal(
            job, "the device path toward a rank on another node (put/get/signal through NVSHMEM) is not built "
                 "yet, and a load or store there would fault: start one job per node for now (docs/multi-node.md)")

    def create(self, backend, nbytes: int, device, comm) -> HeapMemory:
        import torch.distributed as dist
        from torch.distributed import _symmetric_memory as symm_mem

        config.default_nvshmem_symmetric_size(nbytes)  # the engine's own heap must hold ours
        local, failure = None, None
        try:
            _use_torch_shmem_backend(symm_mem, device)
            local = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        except (RuntimeError, MemoryError) as error:
            failure = f"torch's {TORCH_BACKEND} symmetric memory could not allocate {nbytes} bytes on {device}: {error}"
        raise_if_any_rank_failed(comm, failure)  # before the collective rendezvous, which would wait for it
        if comm.world_size == 1:  # torch refuses the rendezvous of a group of one: there is no peer to map
            handle, pointers = None, [local.data_ptr()]
        else:
            handle = symm_mem.rendezvous(local, dist.group.WORLD)
            pointers = [int(p) for p in handle.buffer_ptrs]
        offset = local.data_ptr() - pointers[comm.rank]  # where our tensor starts in the engine's allocation
        bases = [p + offset if p else 0 for p in pointers]  # 0: a peer the engine maps no pointer to

        def release_peers():
            nonlocal handle  # the engine unmaps peers itself when the allocation is freed
            handle = None

        return HeapMemory(local=local, bases=bases, release_peers=release_peers)
