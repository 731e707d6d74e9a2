"""The symmetric heap: one region per rank, carved by a bump allocator. Every rank allocates alike, so an
object's offset from its heap base is the same everywhere: ``remote = heap_bases[to] + (ptr - heap_bases[from])``.

Example:
    >>> heap = SymmetricHeap(backend, 1 << 30, device, comm, layout=reserved_layout(world))
    >>> x = heap.allocate((1024,), torch.float32)
"""

from __future__ import annotations

import math

import torch

from iris.memory.reserved import ReservedLayout

MIN_ALIGNMENT = 256
#: at most this many bytes beyond an allocation's end are backed with it (an on-demand heap grows by doubling)
GROWTH_STEP = 1 << 30


def extent_bytes(tensor: torch.Tensor) -> int:
    """Bytes from ``tensor``'s first element to just past its last one (a strided view spans its gaps too)."""
    return (sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride())) + 1) * tensor.element_size()


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class SymmetricHeap:
    """This rank's share: ``nbytes`` that allocations may use, then the reserved ``layout``
    (:mod:`iris.memory.reserved`), from ``provider`` (default ``ipc``, the backend's own); made collectively
    over ``comm``; ``nodes``: each rank's node (None: one); ``on_demand``: reserve the range and back it as the
    allocations grow, where the backend can (``allocator_type="vmem"``)."""

    def __init__(self, backend, nbytes: int, device: torch.device, comm, layout: ReservedLayout | None = None,
                 provider=None, nodes: tuple[int, ...] | None = None, on_demand: bool = False):
        self.size = nbytes
        self.layout = layout or ReservedLayout([])
        self.reserved = -(-self.layout.nbytes // MIN_ALIGNMENT) * MIN_ALIGNMENT
        self.device = device
        self._comm = comm
        if provider is None:
            from iris.memory.providers import create_provider

            provider = create_provider("ipc")
        self.provider = provider.name
        self._memory = provider.create(backend, nbytes + self.reserved, device, comm, nodes, on_demand=on_demand)
        self._offset = 0
        self._backed_to = 0  # allocations below this offset are backed on every rank
        if self._memory.back is not None:
            self._memory.back(nbytes, nbytes + self.reserved)  # the reserved regions, zeroed before any call
        misaligned = [hex(b) for b in self._memory.bases if b % MIN_ALIGNMENT]
        if misaligned:
            raise RuntimeError(f"heap bases {misaligned} are not {MIN_ALIGNMENT}-byte aligned")

    @property
    def bases(self) -> list[int]:
        return self._memory.bases

    @property
    def base(self) -> int:
        return self._memory.bases[self._comm.rank]

    @property
    def start(self) -> torch.Tensor:
        """The heap's first byte (int8, one element): a kernel addresses any heap offset from its pointer."""
        return self._memory.local[:1]

    def allocate(self, shape: int | tuple[int, ...], dtype: torch.dtype,
                 alignment: int = MIN_ALIGNMENT) -> torch.Tensor:
        """A new uninitialized tensor of ``shape`` (or a number of elements: one-dimensional) and ``dtype``;
        MemoryError where the heap has not enough free bytes left."""
        self.refuse_if_closed("allocating")
        if isinstance(shape, int):
            shape = (shape,)
        nbytes = math.prod(shape) * _element_size(dtype)
        start = -(-self._offset // alignment) * alignment
        if start + nbytes > self.size:
            raise MemoryError(
                f"symmetric heap exhausted: requested {nbytes} bytes (shape {tuple(shape)}, {dtype}), "
                f"{max(self.size - start, 0)} bytes free of {self.size}; pass a larger heap_size to iris.iris()"
            )
        limit = self._memory.backing_limit
        if limit is not None and start + nbytes > limit:
            raise MemoryError(
                f"symmetric heap: requested {nbytes} bytes (shape {tuple(shape)}, {dtype}) at offset {start}; the "
                f"heap reserves {self.size} bytes per rank and backs them on first touch, and this machine can "
                f"back {limit} per rank: {self._memory.backing_note}. Free memory, use fewer ranks, or allocate "
                "less")
        if self._memory.back is not None and start + nbytes > self._backed_to:
            self._back(start + nbytes, f"{nbytes} bytes (shape {tuple(shape)}, {dtype})")
        self._offset = start + max(nbytes, 1)
        region = self._memory.local[start : start + nbytes]
        return region.view(dtype).view(shape)

    @property
    def closed(self) -> bool:
        return self._memory is None

    def refuse_if_closed(self, what: str) -> None:
        """RuntimeError naming ``what`` once :meth:`close` has run: the peers' heaps are unmapped, and a launch
        that reached one would fault."""
        if self._memory is None:
            raise RuntimeError(f"{what}: this Iris context is closed; create a new one with iris.iris()")

    def _back(self, end: int, what: str) -> None:
        # collective, as allocations are: grow by at least the bytes backed so far (at most GROWTH_STEP more than
        # asked), so a heap that grows steadily asks its peers a few times only
        target = min(max(end, min(2 * self._backed_to, end + GROWTH_STEP)), self.size)
        try:
            self._memory.back(self._backed_to, target)
        except MemoryError as error:
            raise MemoryError(f"symmetric heap: backing bytes {self._backed_to}-{target} for an allocation of "
                              f"{what} failed: {error}. Free device memory, use fewer ranks per device, or allocate "
                              "less") from error
        self._backed_to = target

    def usage(self) -> dict:
        """``{"reserved": bytes of the heap's range per rank (allocatable and reserved regions), "allocated": bytes
        the allocations reach, "backed": bytes of the range backed by memory now, "backable": bytes the
        allocations may reach before the machine could not back them (the heap's size where it is backed up
        front or in chunks on request)}``."""
        limit = self._memory.backing_limit
        backed = self.size + self.reserved if self._memory.backed is None else self._memory.backed()
        return {"reserved": self.size + self.reserved, "allocated": self._offset, "backed": backed,
                "backable": self.size if limit is None else limit}

    def region(self, name: str) -> torch.Tensor:
        """Reserved region ``name`` of the layout (the same offset on every rank), as a tensor."""
        offset, count, dtype = self.layout.place(name)
        start = self.size + offset
        return self._memory.local[start : start + count * _element_size(dtype)].view(dtype)

    def peer_address(self, address: int, peer: int) -> int:
        """Where ``address`` (in this rank's heap) lies in rank ``peer``'s heap, as this process maps it (see
        :meth:`maps`). Example: ``heap.peer_address(out.data_ptr(), 1)`` is rank 1's ``out``."""
        return self.bases[peer] + address - self.base

    def maps(self, ranks=None) -> bool:
        """Whether every rank of ``ranks`` (default: all) has its heap mapped in this process; a rank reached only
        through the engine (another node, the ``shmem`` provider) has none, so no copy can reach it."""
        bases = self.bases
        return all(bases[rank] for rank in (range(len(bases)) if ranks is None else ranks))

    def locate(self, address: int) -> tuple[int, int] | None:
        """(owning rank, heap offset) of an address in this process's view of any rank's heap, or None."""
        for owner, base in enumerate(self.bases):
            if base <= address < base + self.size + self.reserved:
                return owner, address - base
        return None

    def contains(self, tensor: torch.Tensor) -> bool:
        """True when every byte ``tensor`` can address lies inside this rank's heap."""
        if self._memory is None or tensor.device != self._memory.local.device:
            return False
        if tensor.numel() == 0:  # torch reports address 0 for every empty tensor: its storage tells
            return tensor.untyped_storage().data_ptr() == self._memory.local.untyped_storage().data_ptr()
        start = tensor.data_ptr()
        return self.base <= start and start + extent_bytes(tensor) <= self.base + self.size + self.reserved

    def close(self, collective: bool) -> None:
        """Unmap the peers' heaps; with ``collective``, first wait for every rank (and again after)."""
        if self._memory is None:
            return
        if collective:
            self._comm.barrier()
        self._memory.release_peers()
        if collective:
            self._comm.barrier()
        self._memory = None
