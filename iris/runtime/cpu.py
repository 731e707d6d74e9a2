"""CPU backend: each rank's heap is a POSIX shared-memory segment (``allocator_type="torch"``) or memfd chunks
mapped into a reserved range as allocations grow (``"vmem"``, :mod:`iris.runtime.vmm_host`).

Every rank maps every peer's segment, so heap bases are plain addresses that Triton's interpreter dereferences,
and its 32- and 64-bit atomics are atomic across processes. Segments are unlinked once every rank has mapped
them, so a later crash leaks nothing.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import uuid

import torch

from iris import config
from iris.runtime.base import Backend, HeapMemory, raise_if_any_rank_failed
from iris.runtime.copy_queue import ThreadCopyQueue
from iris.runtime.shm import (SEGMENT_PREFIX, backing_capacity, capacity_report, create_segment, open_segment,
                              remove_stale_segments)


def segment_name(job: str, context: str, rank: int) -> str:
    return f"/{SEGMENT_PREFIX}{job}_{context}_{rank}"


def _address(mapping: mmap.mmap) -> int:
    # A ctypes view pins the mapping only while the view lives; take the address and drop it.
    view = ctypes.c_char.from_buffer(mapping)
    address = ctypes.addressof(view)
    del view
    return address


class CpuBackend(Backend):
    name = "cpu"
    interpreted = True
    # The interpreter's bfloat16 tl.dot is wrong (numpy has no bfloat16), so dot operands go in as float32.
    compiles_kernels = False
    runs_programs_in_turn = True
    upcasts_narrow_floats = True
    has_streams = False
    has_copy_engine = False
    tensor_descriptors = True
    native_graph_launch = False
    engine_reaches_other_nodes = False
    memory_on_host = True
    inline_asm = None
    default_allocator = "vmem"

    def xcc_count(self, device_index=None) -> int:
        return 1

    @staticmethod
    def arch_name(props) -> str:
        return ""

    def float8_formats(self, device) -> tuple:
        # Triton's interpreter converts to the OCP formats in software
        return (torch.float8_e4m3fn, torch.float8_e5m2)

    def device_count(self) -> int:
        return 1

    def device_for(self, rank: int) -> torch.device:
        return torch.device("cpu")

    def compute_unit_count(self, device) -> int:
        return os.cpu_count() or 1

    def copy_queue(self, device):
        return ThreadCopyQueue()

    def copy(self, dst: int, src: int, nbytes: int, stream=None) -> None:
        ctypes.memmove(dst, src, nbytes)  # every heap of the job is mapped into this process

    def debug_record(self, device, words):
        record = torch.zeros(words, dtype=torch.int64)  # kernels run on the host: the host's memory
        return record, record.data_ptr()

    def copy_rows(self, dst, dst_pitch, src, src_pitch, row_bytes, rows, stream=None) -> None:
        if dst_pitch == src_pitch == row_bytes:  # the rows are one run of bytes
            ctypes.memmove(dst, src, row_bytes * rows)
            return
        for row in range(rows):
            ctypes.memmove(dst + row * dst_pitch, src + row * src_pitch, row_bytes)

    def export_memory(self, tensor: torch.Tensor):
        """(pid, fd, storage bytes, byte offset): a peer of the same user opens ``/proc/<pid>/fd/<fd>``. Only
        memory torch shares by file descriptor (``t.share_memory_()`` under its default strategy) has one."""
        if tensor.device.type != "cpu":
            raise ValueError(f"a tensor on {tensor.device}: the CPU backend maps host memory only")
        storage = tensor.untyped_storage()
        try:
            fd = storage._get_shared_fd()  # unlike _share_fd_cpu_, never moves private memory into a new segment
        except RuntimeError:
            how = ("shared by file name (torch's 'file_system' sharing strategy); share it under the "
                   "'file_descriptor' strategy" if storage.is_shared() else "in private memory")
            raise ValueError(f"this tensor is {how}, which peers cannot map without a copy: call t.share_memory_() "
                             "first (zero-copy from then on), or ctx.as_symmetric(t) for a copy on the heap") from None
        return os.getpid(), fd, storage.nbytes(), tensor.data_ptr() - storage.data_ptr()

    def import_memory(self, handle):
        pid, fd, nbytes, offset = handle
        descriptor = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDWR)
        try:
            mapping = mmap.mmap(descriptor, nbytes)
        finally:
            os.close(descriptor)  # the mapping keeps the memory
        return _address(mapping) + offset, mapping.close

    def create_heap(self, nbytes: int, device, comm, on_demand: bool = False) -> HeapMemory:
        context = comm.broadcast_object(uuid.uuid4().hex[:8] if comm.rank == 0 else None, src=0)
        job = comm.broadcast_object(config.job_id() or uuid.uuid4().hex[:8], src=0)
        # Either heap is sparse: each rank may back its share of what the machine can back now (rank 0's view,
        # so every rank refuses the same allocation).
        capacity = comm.broadcast_object(backing_capacity() if comm.rank == 0 else None, src=0)
        backing = {"backing_limit": None if capacity is None else min(nbytes, capacity // comm.world_size),
                   "backing_note": f"{comm.world_size} ranks share this machine's memory ({capacity_report()})"}
        if on_demand:
            from iris.runtime.vmm import create_virtual_heap
            from iris.runtime.vmm_host import HostVirtualMemory

            return create_virtual_heap(HostVirtualMemory(), nbytes, comm, f"{job}_{context}", **backing)
        remove_stale_segments()  # what killed ranks of earlier jobs left
        try:
            own, failure = create_segment(segment_name(job, context, comm.rank), nbytes), None
        except MemoryError as error:
            own, failure = None, str(error)
        try:
            raise_if_any_rank_failed(comm, failure)
            peers = {
                r: open_segment(segment_name(job, context, r), nbytes)
                for r in range(comm.world_size)
                if r != comm.rank
            }
            comm.barrier()
            resident, close_reader = own.resident_bytes_reader()
        finally:
            if own is not None:
                own.unlink()
        own = own.mapping
        bases = [_address(own) if r == comm.rank else _address(peers[r]) for r in range(comm.world_size)]
        local = torch.frombuffer(own, dtype=torch.uint8)

        def release_peers():
            for mapping in peers.values():
                mapping.close()
            peers.clear()
            close_reader()

        return HeapMemory(local=local, bases=bases, release_peers=release_peers, backed=resident, **backing)
