"""The virtual-memory heap (``allocator_type="vmem"``): every rank reserves the address range of the whole heap,
backs it with physical chunks as allocations grow, and maps its peers' chunks at the same offsets, so heap bases
and pointer translation are those of a heap backed up front.

A *driver* makes, shares and maps the chunks: :mod:`iris.runtime.vmm_gpu` (the CUDA/HIP driver's virtual-memory
calls) or :mod:`iris.runtime.vmm_host` (memfd chunks mapped into reserved host address space, for the CPU
backend). A chunk is shared as a POSIX file descriptor passed to the other ranks of the node over a Unix socket
(:mod:`iris.runtime.descriptors`). A growth is collective: every rank backs the same chunk in the same order (the
allocator is symmetric), so each peer maps it before the allocation that needs it returns, hence before any
launch can touch it. docs/notes/virtual-memory-heap.md says why this way.

A driver has ``granularity`` (bytes every chunk and mapping is a multiple of), ``reserve(nbytes)`` ->
address, ``free_range(address, nbytes)``, ``create(nbytes)`` -> handle (MemoryError when memory is short),
``release(handle)``, ``export(handle)`` -> a file descriptor, ``import_(fd)`` -> handle, ``map(address, nbytes,
handle)``, ``unmap(address, nbytes)``, ``free_note()`` (what memory is free, for messages) and
``tensor(owner, address, nbytes)`` (a flat uint8 tensor over the range that keeps ``owner`` alive).

Example:
    >>> memory = create_virtual_heap(driver, 64 << 30, comm, tag="job_ctx")
    >>> memory.back(0, 8 << 20)          # collective: the first 8 MiB of every rank's heap are backed
    >>> memory.backed()
    8388608
"""

from __future__ import annotations

import os

from iris.runtime.base import HeapMemory, raise_if_any_rank_failed
from iris.runtime.descriptors import DescriptorExchange
from iris.runtime.libraries import RuntimeApiError


def _round_up(n: int, step: int) -> int:
    return -(-n // step) * step


class _AddressRange:
    """This rank's heap range: the tensors over it keep it alive, and its chunks are unmapped and the range freed
    when the last one is gone."""

    def __init__(self, driver, address: int, span: int):
        self.driver, self.address, self.span = driver, address, span
        self.mapped: list[tuple[int, int]] = []  # (offset, bytes)

    def __del__(self):
        try:
            for offset, nbytes in self.mapped:
                self.driver.unmap(self.address + offset, nbytes)
            self.driver.free_range(self.address, self.span)
        except Exception:  # interpreter shutdown: the process's end reclaims it all
            pass


class VirtualHeap:
    """Every rank's heap range in this process, backed chunk by chunk; the chunks are the same on every rank."""

    def __init__(self, driver, nbytes: int, rank: int, world_size: int):
        self.driver, self.rank, self.world_size = driver, rank, world_size
        self.granule = driver.granularity
        self.span = _round_up(nbytes, self.granule)
        self.exchange: DescriptorExchange | None = None
        self.own = _AddressRange(driver, driver.reserve(self.span), self.span)
        self.peers: dict[int, tuple[int, list]] = {}  # rank -> (its range's address here, mapped (offset, bytes))
        try:
            for peer in range(self.world_size):
                if peer != self.rank:
                    self.peers[peer] = (driver.reserve(self.span), [])
        except Exception:
            self.release_peers()
            raise

    def bases(self) -> list[int]:
        return [self.own.address if r == self.rank else self.peers[r][0] for r in range(self.world_size)]

    @property
    def chunks(self) -> list[tuple[int, int]]:
        """The [lo, hi) byte ranges backed, sorted: this rank's mapped chunks, the same on every rank."""
        return sorted((offset, offset + nbytes) for offset, nbytes in self.own.mapped)

    def backed(self) -> int:
        """Bytes of this rank's heap backed by memory."""
        return sum(nbytes for _, nbytes in self.own.mapped)

    def back(self, lo: int, hi: int) -> None:
        """Collective: back bytes [lo, hi) of every rank's heap (rounded out to the granularity), in the same
        chunks everywhere. MemoryError on every rank when any rank cannot back its chunk."""
        lo = lo // self.granule * self.granule
        hi = min(_round_up(hi, self.granule), self.span)
        for gap_lo, gap_hi in self._gaps(lo, hi):
            self._grow(gap_lo, gap_hi)

    def _gaps(self, lo: int, hi: int) -> list[tuple[int, int]]:
        gaps, cursor = [], lo
        for chunk_lo, chunk_hi in self.chunks:
            if chunk_hi <= cursor or chunk_lo >= hi:
                continue
            if chunk_lo > cursor:
                gaps.append((cursor, chunk_lo))
            cursor = max(cursor, chunk_hi)
        if cursor < hi:
            gaps.append((cursor, hi))
        return gaps

    def _grow(self, lo: int, hi: int) -> None:
        handle = fd = failure = None
        try:
            handle = self.driver.create(hi - lo)
            fd = self.driver.export(handle)
        except (MemoryError, RuntimeApiError, OSError) as error:
            failure = f"{error} ({self.driver.free_note()})"
        try:
            received = self.exchange.round({"lo": lo, "hi": hi, "failure": failure}, fd,
                                           what=f"backing heap bytes {lo}-{hi}")
        finally:
            if fd is not None:
                os.close(fd)  # the peers hold their own descriptors now
        try:
            self._check_agreement(lo, hi, failure, received)
            self._map_chunk(self.own.address, lo, hi, handle, self.own.mapped)
            for peer, (_, peer_fd) in received.items():
                peer_handle = self.driver.import_(peer_fd)
                try:
                    self._map_chunk(self.peers[peer][0], lo, hi, peer_handle, self.peers[peer][1])
                finally:
                    self.driver.release(peer_handle)
        finally:
            for _, peer_fd in received.values():
                if peer_fd is not None:
                    os.close(peer_fd)
            if handle is not None:
                self.driver.release(handle)  # a mapped chunk lives until it is unmapped

    def _check_agreement(self, lo: int, hi: int, failure: str | None, received: dict) -> None:
        failures = {r: h["failure"] for r, (h, _) in received.items() if h.get("failure")}
        if failure:
            failures[self.rank] = failure
        if failures:
            rank = min(failures)
            raise MemoryError(f"rank {rank} could not back heap bytes {lo}-{hi}: {failures[rank]}")
        for peer, (header, _) in sorted(received.items()):
            if (header["lo"], header["hi"]) != (lo, hi):
                raise RuntimeError(
                    f"rank {self.rank} backs heap bytes {lo}-{hi} while rank {peer} backs {header['lo']}-"
                    f"{header['hi']}: the ranks allocated different sizes or in a different order; every rank must "
                    "make the same allocations in the same order")

    def _map_chunk(self, base: int, lo: int, hi: int, handle, mapped: list) -> None:
        self.driver.map(base + lo, hi - lo, handle)
        mapped.append((lo, hi - lo))

    def release_peers(self) -> None:
        """Unmap the peers' chunks and free their ranges (this rank's own go with its last tensor)."""
        for address, mapped in self.peers.values():
            for offset, nbytes in mapped:
                self.driver.unmap(address + offset, nbytes)
            self.driver.free_range(address, self.span)
        self.peers.clear()
        if self.exchange is not None:
            self.exchange.close()
            self.exchange = None


def create_virtual_heap(driver, nbytes: int, comm, tag: str, **heap_fields) -> HeapMemory:
    """Collective: an on-demand heap of ``nbytes`` per rank (its first granule backed, so the tensor over it
    starts on memory) as a :class:`HeapMemory` whose ``back`` grows it; ``tag``: unique on the node;
    ``heap_fields``: further :class:`HeapMemory` fields (a backing limit)."""
    heap = failure = None
    try:
        heap = VirtualHeap(driver, nbytes, comm.rank, comm.world_size)
    except (MemoryError, RuntimeApiError, OSError) as error:
        failure = (f"{error} (reserving {comm.world_size} address ranges of {nbytes} bytes, this rank's and its "
                   f"peers'; {driver.free_note()})")
    try:
        raise_if_any_rank_failed(comm, failure)
        heap.exchange = DescriptorExchange(comm, tag)
        heap.back(0, 1)
        local = driver.tensor(heap.own, heap.own.address, nbytes)
    except Exception:
        if heap is not None:
            heap.release_peers()
        raise
    return HeapMemory(local=local, bases=heap.bases(), release_peers=heap.release_peers, back=heap.back,
                      backed=heap.backed, **heap_fields)
