"""Peer-base tables: translation into any object that lies on every rank, on the heap or not.

Device code moves a pointer between ranks by the difference of two bases (``iris.translate``). A *peer-base
table* is a context tensor of the heap's layout (:func:`iris.device.context.build_context_tensor`: rank, world,
bases, debug word) whose bases are one object's first byte on each rank, as mapped in this process. Passed where
a kernel takes ``heap_bases``, it translates pointers into that object wherever each rank's allocator put it, so
one kernel runs unchanged over heap tensors and over tensors made elsewhere and mapped without a copy through
the backend's ``export_memory`` / ``import_memory``. The table's debug word stays 0: debug mode's heap-bound
checks do not apply to it.

Example:
    >>> x = torch.empty(1024).share_memory_()       # made outside Iris (CPU backend)
    >>> table = ctx.register_external_tensor(x)     # every rank, its own x, the same shape and dtype
    >>> kernel[grid](x, n, table)                   # iris.load(x + offs, rank, peer, table)
    >>> ctx.deregister_external_tensor(x)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from iris.device.context import build_context_tensor
from iris.device.rma import HEAP_BASES_SLOT
from iris.memory.heap import extent_bytes

#: iris.translate moves a pointer by whole chunks of this many bytes: bases must differ by multiples of it.
CHUNK_BYTES = 16


def peer_base_table(rank: int, world: int, bases: list[int], device) -> torch.Tensor:
    """The int64 table of ``bases`` (one per rank) that device ops take as ``heap_bases``.

    Example: ``table = peer_base_table(rank, world, [a0, a1], device)``
    """
    words = build_context_tensor(rank, world, bases, device)
    return words[HEAP_BASES_SLOT.value:HEAP_BASES_SLOT.value + world]


@dataclass(eq=False)
class _Registration:
    tensor: torch.Tensor  # held, so that the memory peers map outlives their mappings
    table: torch.Tensor
    releases: list[Callable[[], None]] = field(default_factory=list)

    def covers(self, tensor: torch.Tensor) -> bool:
        start = self.tensor.data_ptr()
        return (tensor.device == self.tensor.device and start <= tensor.data_ptr()
                and tensor.data_ptr() + extent_bytes(tensor) <= start + extent_bytes(self.tensor))

    def release(self) -> None:
        releases, self.releases = self.releases, []
        for release in releases:
            release()


@dataclass(frozen=True)
class _Offer:
    """What one rank brings to a registration (gathered from every rank before any mapping)."""

    failure: str | None
    shape: tuple = ()
    stride: tuple = ()
    dtype: str = ""
    address_mod_chunk: int = 0
    heap_offset: int | None = None
    registered: bool = False
    handle: object = None


def _ranks(ranks) -> str:
    return ", ".join(str(r) for r in ranks)


def _refuse_asymmetry(offers: list[_Offer]) -> None:
    """ValueError, the same on every rank, for offers that cannot make one symmetric object."""
    failures = [f"rank {r}: {o.failure}" for r, o in enumerate(offers) if o.failure]
    if failures:
        raise ValueError("register_external_tensor: " + "; ".join(failures))
    for attribute in ("shape", "stride", "dtype"):
        values = [getattr(o, attribute) for o in offers]
        if len(set(values)) > 1:
            raise ValueError(f"register_external_tensor: every rank must pass a tensor of the same {attribute}; got "
                             + ", ".join(f"rank {r}: {v}" for r, v in enumerate(values)))
    if len({o.address_mod_chunk for o in offers}) > 1:
        raise ValueError(f"register_external_tensor: the tensors' addresses must agree modulo {CHUNK_BYTES} bytes "
                         "(translation moves pointers by whole chunks of that many bytes); got "
                         + ", ".join(f"rank {r}: {o.address_mod_chunk}" for r, o in enumerate(offers))
                         + f". Allocate them {CHUNK_BYTES}-byte aligned")
    for attribute, what in (("heap_offset", "on the symmetric heap"), ("registered", "registered already")):
        yes = [r for r, o in enumerate(offers) if getattr(o, attribute) not in (None, False)]
        if yes and len(yes) < len(offers):
            no = [r for r in range(len(offers)) if r not in yes]
            raise ValueError(f"register_external_tensor: the tensor is {what} on rank(s) {_ranks(yes)} but not on "
                             f"rank(s) {_ranks(no)}: every rank registers alike, in the same order")


class ExternalMemory:
    """The tensors registered with one context (collectively: every rank alike, in the same order), their tables
    and the mappings of the peers' memory, kept until :meth:`deregister` or :meth:`close`.

    Example:
        >>> external = ExternalMemory(backend, comm, heap, device, nodes)
        >>> table = external.register(x)
    """

    def __init__(self, backend, comm, heap, device, nodes: tuple[int, ...]):
        self._backend, self._comm, self._heap, self._device = backend, comm, heap, device
        self._one_node = len(set(nodes)) <= 1
        self._records: list[_Registration] = []
        self._closed = False

    def _find(self, tensor) -> _Registration | None:
        return next((r for r in self._records if r.tensor is tensor or (
            r.tensor.data_ptr() == tensor.data_ptr() and r.tensor.shape == tensor.shape
            and r.tensor.stride() == tensor.stride() and r.tensor.dtype == tensor.dtype)), None)

    def _offer(self, tensor) -> _Offer:
        if not isinstance(tensor, torch.Tensor):
            return _Offer(f"{type(tensor).__name__} is not a torch.Tensor")
        if not self._one_node:
            return _Offer("the job spans nodes: peers map each other's memory within one node only")
        if tensor.numel() == 0:
            return _Offer("the tensor has no elements to map")
        facts = dict(shape=tuple(tensor.shape), stride=tuple(tensor.stride()), dtype=str(tensor.dtype),
                     address_mod_chunk=tensor.data_ptr() % CHUNK_BYTES)
        record = self._find(tensor)
        if record is not None:
            return _Offer(None, registered=True, **facts)
        if self._heap.contains(tensor):  # the peers' heaps are mapped already
            return _Offer(None, heap_offset=tensor.data_ptr() - self._heap.base, **facts)
        try:
            return _Offer(None, handle=self._backend.export_memory(tensor), **facts)
        except (ValueError, RuntimeError) as error:
            return _Offer(str(error))

    def register(self, tensor: torch.Tensor) -> torch.Tensor:
        """Collective: map every peer's tensor here and return the table (the same table again for a tensor
        registered already). ValueError on every rank, before any mapping, for a tensor a rank cannot share or
        tensors that differ between ranks; RuntimeError on every rank where a mapping failed."""
        if self._closed:  # every rank closed its context: refused alike
            raise RuntimeError("this Iris context is closed; create a new one with iris.iris()")
        offers = self._comm.all_gather_object(self._offer(tensor))
        _refuse_asymmetry(offers)
        rank, world = self._comm.rank, self._comm.world_size
        if offers[rank].registered:
            return self._find(tensor).table
        record = _Registration(tensor, None)
        if offers[rank].heap_offset is not None:
            bases = [self._heap.bases[r] + o.heap_offset for r, o in enumerate(offers)]
        else:
            bases = self._map(tensor, offers, record)
        record.table = peer_base_table(rank, world, bases, self._device)
        self._records.append(record)
        return record.table

    def _map(self, tensor, offers: list[_Offer], record: _Registration) -> list[int]:
        rank = self._comm.rank
        bases, failure = [], None
        for peer, offer in enumerate(offers):
            if peer == rank:
                bases.append(tensor.data_ptr())
                continue
            try:
                address, release = self._backend.import_memory(offer.handle)
            except (OSError, RuntimeError, ValueError) as error:
                failure = f"rank {rank} could not map rank {peer}'s tensor: {error}"
                break
            record.releases.append(release)
            bases.append(address)
        if failure is None and any((b - tensor.data_ptr()) % CHUNK_BYTES for b in bases):
            failure = f"rank {rank} mapped the peers at {[hex(b) for b in bases]}, not {CHUNK_BYTES}-byte apart"
        failures = [f for f in self._comm.all_gather_object(failure) if f]
        if failures:
            record.release()
            raise RuntimeError("register_external_tensor: " + "; ".join(failures))
        return bases

    def deregister(self, tensor: torch.Tensor) -> None:
        """Collective: unmap the peers' memory of a registered tensor; ValueError on every rank where a rank has
        not registered it."""
        record = self._find(tensor) if isinstance(tensor, torch.Tensor) else None
        present = self._comm.all_gather_object(record is not None)
        if not all(present):
            missing = [r for r, p in enumerate(present) if not p]
            raise ValueError(f"deregister_external_tensor: the tensor is not registered on rank(s) {_ranks(missing)};"
                             " pass each rank's tensor given to register_external_tensor")
        self._backend.synchronize(self._device)  # this rank's kernels are done with the mappings
        record.release()
        self._comm.barrier()  # every importer unmapped before an exporter may free its tensor
        self._records.remove(record)

    def table_of(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """The table of the registered tensor ``tensor`` lies in (a view of it too), or None."""
        record = next((r for r in self._records if r.covers(tensor)), None) if tensor.numel() else None
        return None if record is None else record.table

    def close(self, collective: bool) -> None:
        """Unmap everything; with ``collective``, between two barriers (every rank holds the same registrations,
        so every rank takes them)."""
        self._closed = True
        if not self._records:
            return
        if collective:
            self._comm.barrier()
        for record in self._records:
            record.release()
        if collective:
            self._comm.barrier()
        self._records.clear()
