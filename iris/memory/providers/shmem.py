"""The ``shmem`` heap provider: one NVSHMEM (NVIDIA) / rocSHMEM (AMD) symmetric allocation per job.

Made through torch's symmetric memory, which ships the engine on both vendors and bootstraps it from the
process group Iris already has, so Iris adds no dependency. Peers of the node are reached by the pointers the
engine maps; ranks on other nodes get base 0 and go through :mod:`iris.device.nvshmem`.
"""

from __future__ import annotations

import functools

import torch

import triton.language as tl

from iris import config
from iris.runtime import backend_class
from iris.runtime.capabilities import limitation
from iris.memory.collective_free import CollectiveFrees
from iris.memory.providers.base import HeapProvider, JobFacts
from iris.runtime.base import HeapMemory, raise_if_any_rank_failed

#: torch's shmem backend's name on CUDA and ROCm builds alike
TORCH_BACKEND = "NVSHMEM"


def engine_available() -> bool:
    """Whether torch can run NVSHMEM/rocSHMEM in this process (a build with it, a GPU it accepts)."""
    try:
        from torch.distributed import _symmetric_memory as symm_mem

        return bool(symm_mem.is_nvshmem_available())
    except (ImportError, RuntimeError):
        return False


def _refusal_of_shared_devices(job: JobFacts) -> str | None:
    """Ranks sharing a GPU are refused unless CUDA MPS shares its threads among them (NVSHMEM's rule)."""
    for device in sorted(set(job.devices)):
        ranks = [r for r, d in enumerate(job.devices) if d == device]
        shares = [job.mps_shares[r] if r < len(job.mps_shares) else None for r in ranks]
        if len(ranks) > 1 and (None in shares or sum(shares) > 100):
            listed = ", ".join(f"rank {r}: {s if s is not None else 'unset'}" for r, s in zip(ranks, shares))
            return (f"heap='shmem' puts ranks {', '.join(map(str, ranks))} on {device} (IRIS_SIMULATION?), and "
                    "NVSHMEM runs several processes per GPU only under CUDA MPS with each one's "
                    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE set so that they sum to 100 or less "
                    f"(here {listed}): start nvidia-cuda-mps-control -d and set it to {100 // len(ranks)}, or use "
                    "heap='ipc' to put several ranks on one GPU")
    return None


def size_refusal(nbytes: int, free: int, total: int, device) -> str | None:
    """Why a heap of ``nbytes`` cannot fit in ``free`` bytes, or None; asked first, as NVSHMEM ends the process.

    Example:
        >>> size_refusal(1 << 50, free=80 << 30, total=141 << 30, device="cuda:0") is not None
        True
    """
    if nbytes <= free:
        return None
    return (f"torch's {TORCH_BACKEND} symmetric memory cannot hold {nbytes} bytes on {device}: {device} has "
            f"{free} of {total} bytes free")


def far_bases(pointers: list[int], nodes: tuple[int, ...], rank: int) -> list[int]:
    """The heap bases a kernel of ``rank`` sees: the engine's pointers on its node, 0 for other nodes."""
    return [pointer if nodes[peer] == nodes[rank] else 0 for peer, pointer in enumerate(pointers)]


_engine_library: str | None = None


def compile_engine_path() -> None:
    """Compile this process's kernels with the path toward ranks on other nodes from now on (idempotent).

    Links NVSHMEM's device library into every launch and initializes it in each module that uses it. Call it
    before the first kernel compiles: Triton refuses a kernel whose constants changed after it compiled.
    """
    global _engine_library
    if _engine_library is not None:
        return
    import triton
    from torch.distributed._symmetric_memory._nvshmem_triton import NvshmemLibFinder
    from triton.runtime.jit import JITFunction

    from iris.device import rma

    from iris.memory.providers.engine_library import slim_library

    library = slim_library(NvshmemLibFinder.find_device_library(), triton.runtime.driver.active.get_current_target())
    launch = JITFunction.run

    def run_with_engine(kernel, *args, **kwargs):
        kwargs.setdefault("extern_libs", {"libnvshmem_device": library})
        return launch(kernel, *args, **kwargs)

    earlier_hook = triton.knobs.runtime.jit_post_compile_hook

    def initialize_engine_in_module(*args, **kwargs):
        result = earlier_hook(*args, **kwargs) if earlier_hook is not None else None
        from torch._C._distributed_c10d import _nvshmemx_cumodule_init

        compiled = kwargs["fn"].jit_function.device_caches[kwargs["compile"]["device"]][0].get(kwargs["key"])
        if compiled is not None and "nvshmemi_device_state_d" in compiled.asm.get("ptx", ""):
            compiled.run  # noqa: B018  (loads the module)
            _nvshmemx_cumodule_init(compiled.module)
        return result

    JITFunction.run = run_with_engine
    triton.knobs.runtime.jit_post_compile_hook = initialize_engine_in_module
    rma.ENGINE = tl.constexpr(True)
    _engine_library = library


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
    reaches_by_engine = True  # a rank on another node, or one the engine maps no pointer to (see create)

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
        shared = _refusal_of_shared_devices(job)
        if shared:
            return shared
        if not backend_class(job.backend).engine_reaches_other_nodes:
            return self.spans_nodes_refusal(
                job, "the device path toward a rank on another node is built on NVSHMEM's device calls only; "
                     "rocSHMEM's (AMD) are not wired yet: start one job per node for now (docs/multi-node.md)")
        return None

    def create(self, backend, nbytes: int, device, comm, nodes: tuple[int, ...] | None = None,
               on_demand: bool = False) -> HeapMemory:
        # the engine's heap: allocated by the engine whatever allocator_type says (on_demand has no meaning here)
        import torch.distributed as dist
        from torch.distributed import _symmetric_memory as symm_mem

        frees = _collective_frees()
        frees.free_unused(comm)  # collective, as is this call
        local, failure = None, size_refusal(nbytes, *torch.cuda.mem_get_info(device), device)
        if failure is None:
            config.default_nvshmem_symmetric_size(nbytes)  # the engine's own heap must hold ours
            try:
                _use_torch_shmem_backend(symm_mem, device)
                local = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
            except (RuntimeError, MemoryError) as error:
                failure = (f"torch's {TORCH_BACKEND} symmetric memory could not allocate {nbytes} bytes on {device}: "
                           f"{error}")
        try:
            raise_if_any_rank_failed(comm, failure)  # before the collective rendezvous, which would wait for it
        except MemoryError:
            if local is not None:  # another rank failed: a free of ours alone would wait for it forever
                frees.abandon(local)
            raise
        if comm.world_size == 1:  # torch refuses the rendezvous of a group of one: there is no peer to map
            handle, pointers = None, [local.data_ptr()]
        else:
            handle = symm_mem.rendezvous(local, dist.group.WORLD)
            pointers = [int(p) for p in handle.buffer_ptrs]
        offset = local.data_ptr() - pointers[comm.rank]  # where our tensor starts in the engine's allocation
        bases = [p + offset if p else 0 for p in pointers]  # 0: a peer the engine maps no pointer to
        bases = far_bases(bases, nodes or (0,) * comm.world_size, comm.rank)
        if 0 in bases:  # a rank on another node (or one the engine maps no pointer to): reached by its calls
            compile_engine_path()

        kept = frees.keep(local, handle)  # the engine's free waits for every rank

        def release_peers():  # the engine unmaps peers itself when the allocation is freed
            kept.released = True

        return HeapMemory(local=kept.view(), bases=bases, release_peers=release_peers)


@functools.cache
def _collective_frees() -> CollectiveFrees:
    """This process's shmem allocations, held for collective frees (made on first use)."""
    return CollectiveFrees()
