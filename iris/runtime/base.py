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
