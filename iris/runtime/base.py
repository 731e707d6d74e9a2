"""The one interface every backend implements, so no code elsewhere tests which backend it runs on."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class HeapMemory:
    """One rank's heap: ``local`` (flat ``uint8``), every rank's base valid here, and how to unmap the peers.

    ``backing_limit``: where the heap is an address range whose pages are backed on first touch (the CPU
    backend's shared memory), the bytes of it each rank's allocations may take before the machine could not back
    them, the same on every rank; ``backing_note`` says what the machine holds. None: all of it is backed.

    ``back(lo, hi)``: where the heap is backed in chunks on request (the virtual-memory heap), the collective call
    that backs bytes [lo, hi) of every rank's heap before anything touches them; ``backed()`` its backed bytes.
    None: nothing to ask (backed up front, or on first touch)."""

    local: torch.Tensor
    bases: list[int]
    release_peers: Callable[[], None] = field(default=lambda: None)
    backing_limit: int | None = None
    backing_note: str = ""
    back: Callable[[int, int], None] | None = None
    backed: Callable[[], int] | None = None


def raise_if_any_rank_failed(comm, failure: str | None) -> None:
    """Collective: if any rank's ``failure`` is set, every rank raises MemoryError, so none waits on a peer.

    Example:
        >>> raise_if_any_rank_failed(comm, None if ok else "cudaMalloc of 1 PiB failed")
    """
    failures = comm.all_gather_object(failure)
    if any(failures):
        rank = next(r for r, f in enumerate(failures) if f)
        raise MemoryError(failure or f"rank {rank} could not make its heap: {failures[rank]}")


@dataclass(frozen=True)
class DeviceFacts:
    """What device code compiles against (:func:`iris.runtime.device_facts`): ``inline_asm`` "ptx", "amdgcn" or None.

    Example: ``AMDGCN = tl.constexpr(device_facts().inline_asm == "amdgcn")``
    """

    inline_asm: str | None
    compiles_kernels: bool


class Backend(ABC):
    """A place Iris runs (CUDA, HIP, or CPUs under Triton's interpreter); callers ask it :data:`FACTS`, never its name.

    Example: ``programs = 1 if backend.runs_programs_in_turn else backend.compute_unit_count(device)``
    """

    #: Short name, as IRIS_BACKEND spells it (for labels, not decisions).
    name: str = ""
    #: The inverse of :attr:`compiles_kernels` (scripts read it).
    interpreted: bool = False

    FACTS = ("compiles_kernels", "runs_programs_in_turn", "upcasts_narrow_floats", "has_streams", "has_copy_engine",
             "tensor_descriptors", "native_graph_launch", "engine_reaches_other_nodes", "memory_on_host",
             "inline_asm", "xcc_count", "arch_name", "float8_formats", "default_allocator")

    #: Triton compiles kernels for the device (autotuning, a compile cache); False: its interpreter runs them.
    compiles_kernels: bool
    #: The programs of one launch run one after another in program-id order.
    runs_programs_in_turn: bool
    #: 16-bit float operands of ``tl.dot`` are cast to float32 first (the ``UPCAST`` constexpr of iris.ops).
    upcasts_narrow_floats: bool
    #: Work queues on device streams and runs asynchronously: side streams, timing events, graphs.
    has_streams: bool
    #: :meth:`copy` between devices runs on a copy engine beside the kernels.
    has_copy_engine: bool
    #: Kernels may load tiles through tensor descriptors (``tl.make_tensor_descriptor``, TMA).
    tensor_descriptors: bool
    #: A captured graph can be launched from C through the driver (iris.host.replay.native).
    native_graph_launch: bool
    #: The shmem engine's device path reaches ranks on other nodes (iris.device.nvshmem).
    engine_reaches_other_nodes: bool
    #: The heap is host memory: ``device="cuda"`` names the host, as the heap's device.
    memory_on_host: bool
    #: The inline assembly compiled kernels carry ("ptx", "amdgcn"), or None.
    inline_asm: str | None
    #: The heap a context gets when neither ``allocator_type`` nor IRIS_ALLOCATOR names one: ``"vmem"`` (an
    #: address range backed as allocations grow) or ``"torch"`` (backed up front).
    default_allocator: str

    @abstractmethod
    def xcc_count(self, device_index: int | None = None) -> int:
        """Accelerator dies (XCCs) of device ``device_index`` (None: the current device)."""

    @staticmethod
    @abstractmethod
    def arch_name(props) -> str:
        """The architecture of a device from its torch properties ("sm_90", "gfx942:sramecc+"), "" if none."""

    @abstractmethod
    def float8_formats(self, device: torch.device) -> tuple:
        """The float8 torch dtypes kernels can convert to and store on ``device``: e.g. ``(torch.float8_e4m3fn,
        torch.float8_e5m2)`` on NVIDIA sm_89 and newer, ``()`` where there is none."""

    @classmethod
    def limitations(cls) -> tuple:
        """The rows of the capability table (:mod:`iris.runtime.capabilities`) for this backend."""
        from iris.runtime.capabilities import LIMITATIONS

        return tuple(row for row in LIMITATIONS if row.backend == cls.name)

    @classmethod
    def find_limitation(cls, feature: str, dtype=None, concurrent: bool = False):
        """The capability table's row saying this backend cannot honour ``feature`` (for ``dtype``), or None."""
        from iris.runtime.capabilities import find_limitation

        return find_limitation(cls.name, feature, dtype, concurrent)

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices this process can use."""

    @abstractmethod
    def device_for(self, rank: int) -> torch.device:
        """The device that ``rank`` uses (ranks share devices round-robin)."""

    def activate(self, device: torch.device) -> None:
        """Make ``device`` current for this process."""

    @abstractmethod
    def create_heap(self, nbytes: int, device: torch.device, comm, on_demand: bool = False) -> HeapMemory:
        """Collective: allocate ``nbytes`` on every rank and map every peer's heap; ``on_demand``: reserve the
        range and back it as the allocations grow (``allocator_type="vmem"``), where the backend can."""

    def synchronize(self, device: torch.device, stream=None) -> None:
        """Wait for the work queued on ``device`` (or only on ``stream``)."""

    @abstractmethod
    def compute_unit_count(self, device: torch.device) -> int:
        """Streaming multiprocessors, compute units or CPU cores of ``device``."""

    def shared_memory_per_program(self, device: torch.device) -> int | None:
        """Bytes of shared memory (LDS on AMD) one program of a kernel may use on ``device``: what Triton's
        launcher checks a compiled kernel against (OutOfResources above it). None: no such limit (the
        interpreter). Example: ``backend.shared_memory_per_program(torch.device("cuda", 0))`` -> 232448 on an
        H100."""
        return None

    @staticmethod
    def pipeline_buffers(num_stages: int) -> int:
        """Copies of a loop's operand tiles that Triton's software pipeliner keeps in shared memory at
        ``num_stages`` on this backend's GPUs; NVIDIA's keeps one per stage (sm_90: 128 x 256 x 64 bf16 tiles in 3
        stages compile to 147456 bytes). Example: ``backend.pipeline_buffers(3)`` -> 3."""
        return num_stages

    def wall_clock_rate_khz(self, device: torch.device) -> int:
        """kHz of the clock device timestamps read; nanoseconds by default."""
        return 1_000_000

    @abstractmethod
    def export_memory(self, tensor: torch.Tensor):
        """A picklable handle by which another process of this node maps the memory of ``tensor`` (made by any
        allocator) without a copy; ValueError, saying what to do, where this backend cannot share that memory."""

    @abstractmethod
    def import_memory(self, handle) -> tuple[int, Callable[[], None]]:
        """Map a peer's :meth:`export_memory` handle here: (the address of the peer's tensor's first byte in this
        process, a callable that unmaps it)."""

    @abstractmethod
    def copy_queue(self, device: torch.device):
        """A new :class:`iris.runtime.copy_queue.CopyQueue` on ``device``: copies and flag operations beside the
        kernels (a stream of the copy engine on GPUs, a thread on the CPU backend)."""

    @abstractmethod
    def copy(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        """Copy ``nbytes`` from address ``src`` to ``dst`` (mapped heap or pinned host memory) in ``stream``'s order
        (None: the current stream); asynchronous on a GPU, at once on the CPU backend."""

    @abstractmethod
    def debug_record(self, device: torch.device, words: int) -> tuple[torch.Tensor, int]:
        """(the record a bounded wait or checked access fills, ``words`` int64 zeros, as a tensor the host reads;
        the address kernels write it at). Made once per process (:mod:`iris.host.debug` keeps it)."""

    @abstractmethod
    def copy_rows(self, dst: int, dst_pitch: int, src: int, src_pitch: int, row_bytes: int, rows: int,
                  stream=None) -> None:
        """Copy ``rows`` rows of ``row_bytes`` each, row r from ``src + r * src_pitch`` to ``dst + r * dst_pitch``
        (a 2-D copy: a column block of a row-major matrix), in ``stream``'s order as :meth:`copy` does.

        Example: columns [c, c + w) of an (M, N) float32 matrix at ``a`` into a peer's (M, w) matrix at ``b``:
        ``backend.copy_rows(b, 4 * w, a + 4 * c, 4 * N, 4 * w, M)``."""
