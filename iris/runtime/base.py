"""The one interface every backend implements.

A backend knows how to pick a rank's device, how to make the memory behind a
symmetric heap visible to every rank, and how to wait for a device. Everything
else in Iris is written against this interface, so there is no ``if cpu:``
elsewhere in the code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass
class HeapMemory:
    """The memory behind one rank's symmetric heap, as seen from this process.

    Attributes:
        local: this rank's heap as a flat ``uint8`` tensor on the heap's device.
        bases: every rank's heap base address, valid in this process.
        release_peers: undoes the mapping of the other ranks' heaps (local call).
    """

    local: torch.Tensor
    bases: list[int]
    release_peers: Callable[[], None] = field(default=lambda: None)


def raise_if_any_rank_failed(comm, failure: str | None) -> None:
    """Collective: every rank passes what went wrong in its part of a setup (or None); if any rank
    failed, every rank raises MemoryError with that message, so none waits for a peer that gave up.

    Example:
        >>> raise_if_any_rank_failed(comm, None if ok else "cudaMalloc of 1 PiB failed")
    """
    failures = comm.all_gather_object(failure)
    if any(failures):
        rank = next(r for r, f in enumerate(failures) if f)
        raise MemoryError(failure or f"rank {rank} could not make its heap: {failures[rank]}")


class Backend(ABC):
    """A place Iris runs: CUDA GPUs, HIP GPUs or CPUs under Triton's interpreter."""

    #: Short name, as IRIS_BACKEND spells it.
    name: str = ""
    #: True where Triton kernels run under the interpreter (no GPU code).
    interpreted: bool = False

    @abstractmethod
    def device_count(self) -> int:
        """Number of devices this process can use."""

    @abstractmethod
    def device_for(self, rank: int) -> torch.device:
        """The device that ``rank`` uses (ranks share devices round-robin)."""

    def activate(self, device: torch.device) -> None:
        """Make ``device`` current for this process."""

    @abstractmethod
    def create_heap(self, nbytes: int, device: torch.device, comm) -> HeapMemory:
        """Collective: allocate ``nbytes`` on every rank and map every peer's heap."""

    def synchronize(self, device: torch.device, stream=None) -> None:
        """Wait for the work queued on ``device`` (or only on ``stream``)."""

    @abstractmethod
    def compute_unit_count(self, device: torch.device) -> int:
        """Streaming multiprocessors, compute units or CPU cores of ``device``."""

    def wall_clock_rate_khz(self, device: torch.device) -> int:
        """kHz of the clock device timestamps read (iris.device.sync's clock): nanoseconds by default."""
        return 1_000_000

    @abstractmethod
    def copy(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        """Copy ``nbytes`` from address ``src`` to ``dst`` (either in any heap this process maps, or pinned host
        memory) in ``stream``'s order: the runtime's asynchronous copy on a GPU (the copy engine between
        devices), at once on the CPU backend. ``stream``: a torch stream, or None for the current one."""
