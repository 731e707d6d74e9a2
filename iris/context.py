"""The host facade: ``iris.iris()`` returns an :class:`Iris` context."""

from __future__ import annotations

import functools
import logging as _logging
import numbers

import torch

from iris import config, runtime
from iris.runtime import sim
from iris.device.context import build_context_tensor
from iris.device.rma import HEAP_BASES_SLOT
from iris.host import debug as debug_mode
from iris.host import watchdog
from iris.runtime.distributed import init_distributed, node_local_index, node_map
from iris.runtime.logging import log
from iris.memory.external import ExternalMemory
from iris.memory.heap import SymmetricHeap
from iris.memory.providers import HeapProviderRefusal, JobFacts, create_provider, provider_name
from iris.memory.tensors import TensorFactories, normalize_size
from iris.runtime import launch_options
from iris.host.team import Team, reserved_layout

#: ``allocator_type``'s names: ``"vmem"`` reserves the heap's address range and backs it as allocations grow,
#: ``"torch"`` backs it up front (one device allocation).
ALLOCATORS = ["torch", "vmem"]


def _job_facts(backend, comm, nodes, device, provider) -> JobFacts:
    """What the heap providers decide on, gathered from every rank (equal on every rank). Whether torch can
    run NVSHMEM here is asked only for the shmem heap (False otherwise)."""
    import torch.distributed as dist

    engine = False
    if provider.name == "shmem" and backend.find_limitation("shmem_heap") is None:
        from iris.memory.providers.shmem import engine_available

        engine = engine_available()
    gathered = comm.all_gather_object((str(device), engine, config.mps_share()))
    return JobFacts(backend=backend.name, nodes=nodes, devices=tuple(d for d, _, _ in gathered),
                    distributed=dist.is_available() and dist.is_initialized(), engine=tuple(e for _, e, _ in gathered),
                    mps_shares=tuple(m for _, _, m in gathered))


def _validate(heap_size, allocator_type, debug) -> None:
    if not isinstance(debug, bool):
        raise TypeError(f"debug={debug!r} must be True or False")
    if isinstance(heap_size, bool) or not isinstance(heap_size, numbers.Integral):
        raise TypeError(f"heap_size={heap_size!r} must be an integer number of bytes")
    if heap_size <= 0:
        raise ValueError(f"heap_size={heap_size} must be positive (bytes of symmetric heap per rank)")
    if allocator_type is not None and allocator_type not in ALLOCATORS:
        raise ValueError(f"allocator_type={allocator_type!r} is not an allocator; use one of {', '.join(ALLOCATORS)}")
    config.check_switches()  # a switch set to a word it cannot read is refused now, before any allocation


def allocator_name(requested: str | None, backend) -> str:
    """The allocator a context takes: ``requested`` (``allocator_type=``), else IRIS_ALLOCATOR, else the backend's
    default. Example: ``allocator_name(None, backend)`` is ``"vmem"`` on the CPU backend."""
    if requested is not None:
        return requested
    name = config.allocator_request()
    if name and name not in ALLOCATORS:
        raise ValueError(f"IRIS_ALLOCATOR={name!r} is not an allocator; use one of {', '.join(ALLOCATORS)}")
    return name or backend.default_allocator


class Iris(TensorFactories):
    """One rank's view of a job: its rank, its symmetric heap and the tensor factories. Creating and closing a
    context are collective (every rank, the same ``heap_size``), any number of times in one process.

    Args:
        heap_size: bytes of symmetric heap per rank (default 1 GiB).
        allocator_type: ``"vmem"``: the heap's address range is reserved and backed in chunks as allocations
            grow, so a large ``heap_size`` costs only what is allocated; ``"torch"``: one device allocation,
            backed up front. None (default): IRIS_ALLOCATOR, else the backend's default (``iris info``). On the
            CPU backend the heap is sparse shared memory either way.
        debug: bound every device wait by IRIS_WAIT_TIMEOUT (:class:`iris.WaitTimeoutError`) and check every
            remote access (:class:`iris.DeviceAccessError`); also IRIS_DEBUG=1. See :mod:`iris.host.debug`.
        heap: ``"ipc"`` (default, or IRIS_HEAP: CUDA/HIP IPC, shared memory on the CPU backend) or ``"shmem"``
            (NVSHMEM/rocSHMEM through torch's symmetric memory). See :mod:`iris.memory.providers`.

    Example:
        >>> ctx = iris.iris(heap_size=1 << 24)
        >>> buf = ctx.zeros(4096, device="cuda", dtype=torch.float32)
        >>> ctx.barrier()
        >>> ctx.close()
    """

    def __init__(self, heap_size: int = 1 << 30, allocator_type: str | None = None, debug: bool = False,
                 heap: str | None = None):
        _validate(heap_size, allocator_type, debug)
        provider = create_provider(provider_name(heap))
        debug_mode.enable_stack_dumps()  # under `iris run` only: SIGUSR1 prints the stacks (sent at its timeout)
        backend = runtime.get_backend()
        self.allocator_type = allocator_name(allocator_type, backend)
        comm = init_distributed(backend)
        launch_options.install(backend, comm.rank, comm.world_size)  # AMD-only launch options run anywhere
        sizes = comm.all_gather_object(int(heap_size))
        if len(set(sizes)) != 1:
            raise ValueError(f"every rank must pass the same heap_size; got {sizes} (by rank)")
        nodes = node_map(comm)
        device = backend.device_for(node_local_index(nodes, comm.rank))  # its place on its node picks the GPU
        refusal = provider.refusal(_job_facts(backend, comm, nodes, device, provider))  # the same on every rank
        if refusal:
            raise HeapProviderRefusal(refusal)
        self._node_map = nodes
        self.backend = backend
        self.comm = comm
        self.cur_rank = comm.rank
        self.num_ranks = comm.world_size
        backend.activate(device)
        self._device = device
        self.gpu_id = device.index or 0
        self.heap_size = int(heap_size)
        # device barrier, collectives, and the engine's staging where the provider may compile its path
        layout = reserved_layout(self.num_ranks, engine_path=provider.reaches_by_engine)
        try:
            self.heap = SymmetricHeap(backend, self.heap_size, device, comm, layout=layout, provider=provider,
                                     nodes=nodes, on_demand=self.allocator_type == "vmem")
        except MemoryError as error:
            raise MemoryError(f"heap_size={self.heap_size} bytes per rank (plus {layout.nbytes} reserved) cannot be "
                              f"allocated on {device}: {error}. Pass a smaller heap_size to iris.iris().") from error
        if config.stall_timeout_s() > 0:  # before any kernel compiles: the waits are compiled bounded
            watchdog.watch(self, config.stall_timeout_s())
        words = build_context_tensor(self.cur_rank, self.num_ranks, self.heap.bases, device,
                                     engine_scratch=self.heap.region("engine.scratch").data_ptr())
        self._debug_word = words[-2:-1]  # past the layout get_device_context() keeps
        self._device_context = words[:-2]
        # a view of the context tensor's bases: device ops find the current rank just before them
        self.heap_bases = self._device_context[HEAP_BASES_SLOT.value:HEAP_BASES_SLOT.value + self.num_ranks]
        self.team = Team(self.heap, self.cur_rank, self.num_ranks, backend, self.heap_bases, comm=comm)
        if debug or config.debug_requested():
            self.set_debug(True)
        if config.simulation():
            sim.write_heap_bases(self.cur_rank, self.num_ranks, self.heap.bases)
        self.debug(f"{backend.name} heap of {self.heap_size} bytes at {hex(self.heap.base)} on {device}")
        # The team zeroed its barrier counters and landing flags on the stream: done here before any peer may
        # pass, or a peer's first arrival could land before the zeroing and be wiped (a wait for ever).
        backend.synchronize(device)
        comm.barrier()

    def set_debug(self, on: bool) -> None:
        """Switch this context's debug mode (:mod:`iris.host.debug`) on or off. The first switch-on compiles the
        checks into kernels compiled from then on: do it before the first kernel compiles; after that, switch
        at will, each rank for itself.

        Example:
            >>> ctx = iris.iris(1 << 30, debug=True)
            >>> ctx.set_debug(False)   # the hot loop, unchecked
            >>> ctx.set_debug(True)
        """
        if not isinstance(on, bool):
            raise TypeError(f"set_debug({on!r}): pass True or False")
        if on and not debug_mode.compiled_in():
            debug_mode.enable(self._device, self.heap.size + self.heap.reserved)
        self.backend.synchronize(self._device)  # kernels launched before keep the mode they were launched in
        self._debug_word.fill_(int(on))
        self.team.debug = on

    @property
    def debug_enabled(self) -> bool:
        """Whether this context is in debug mode (:meth:`set_debug`)."""
        return self.team.debug

    # -- lifetime ----------------------------------------------------------------------------

    def close(self) -> None:
        """Collective: wait for every rank, unmap the peers' heaps and registered tensors, wait again. The heap's
        memory is released once neither the context nor a tensor views it (``ctx.ccl`` and ``ctx.ops`` hold the
        context weakly).

        Example:
            >>> ctx.close()
            >>> del ctx, buf   # this rank's heap memory is returned now
        """
        heap = getattr(self, "heap", None)
        if heap is not None:
            self.backend.synchronize(self._device)
            watchdog.stop(heap)  # this context's waits are over; its board goes before the ranks' last barrier
            self._external.close(collective=True)  # registered tensors: their peers' mappings go first
            heap.close(collective=True)
            for facade in ("ccl", "ops"):  # no call replays from now on: each one meets the heap's refusal
                if facade in self.__dict__:
                    self.__dict__[facade]._plans.forget()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        heap = getattr(self, "heap", None)
        if heap is not None:
            try:
                if "_external" in self.__dict__:
                    self._external.close(collective=False)
                heap.close(collective=False)
            except Exception:  # interpreter shutdown
                pass

    # -- collectives and fused ops ----------------------------------------------------------

    # cached_property: made on first use, then a plain attribute read on every call of a collective

    @functools.cached_property
    def ccl(self):
        """The collectives of this context: ``ctx.ccl.all_reduce(out, x)``; see :mod:`iris.ccl`."""
        from iris.ccl import CCL  # imported on first use: the facade does not depend on its plug-ins

        return CCL(self)

    @functools.cached_property
    def tracing(self):
        """Device-side event tracing: ``ctx.tracing.enable()``, ``ctx.tracing.export(...)``; see :mod:`iris.tracing`."""
        from iris.host.tracing import Tracing

        return Tracing(self)

    @functools.cached_property
    def ops(self):
        """GEMM + communication: ``ctx.ops.matmul_all_reduce(out, a, b)``; see :mod:`iris.ops`."""
        from iris.ops import Ops

        return Ops(self)

    # -- identity ----------------------------------------------------------------------------

    def get_rank(self) -> int:
        """This process's rank. Example: ``ctx.get_rank()  # 0``"""
        return self.cur_rank

    def get_num_ranks(self) -> int:
        """Number of ranks in the job. Example: ``ctx.get_num_ranks()  # 2``"""
        return self.num_ranks

    def get_device(self) -> torch.device:
        """The heap's device (``cuda:N``, or ``cpu`` on the CPU backend). Example: ``ctx.get_device()``"""
        return self._device

    def get_device_id(self) -> int:
        """Index of this rank's device (ranks share devices in simulation). Example: ``ctx.get_device_id()``"""
        return self.gpu_id

    def get_cu_count(self) -> int:
        """Streaming multiprocessors (NVIDIA), compute units (AMD) or cores (CPU). Example: ``ctx.get_cu_count()``"""
        return self.backend.compute_unit_count(self._device)

    def get_num_xcc(self) -> int:
        """XCCs (chiplets) of this rank's device: 8 on an MI300X, 1 off AMD (see :func:`iris.get_num_xcc`)."""
        return self.backend.xcc_count(self.gpu_id)

    def get_heap_provider(self) -> str:
        """Where this context's heap memory comes from: ``"ipc"`` or ``"shmem"`` (:mod:`iris.memory.providers`)."""
        return self.heap.provider

    def heap_usage(self) -> dict:
        """This rank's heap in bytes: ``reserved`` (its address range, the reserved regions included),
        ``allocated`` (what the allocations reach), ``backed`` (what memory backs now: chunks of the ``vmem``
        heap, touched pages of the CPU backend's sparse shared memory, all of a ``torch`` heap) and ``backable``
        (what the allocations may reach before the machine could not back them).

        Example:
            >>> ctx = iris.iris(64 << 30)      # 64 GiB reserved per rank, even on a small machine
            >>> ctx.heap_usage()["allocated"]
            0
        """
        return self.heap.usage()

    def get_node_map(self) -> tuple[int, ...]:
        """The node each rank runs on (IRIS_NODE_MAP, or the ranks' host names), e.g. ``(0, 0)``."""
        return self._node_map

    def get_heap_bases(self) -> torch.Tensor:
        """int64 tensor of every rank's heap base, on the heap's device; pass it to kernels.

        Example: ``kernel[grid](buf, n, BLOCK, ctx.get_heap_bases())``
        """
        return self.heap_bases

    def get_device_context(self) -> torch.Tensor:
        """The context tensor for :class:`iris.DeviceContext` (layout in iris/device/context.py).

        Example: ``kernel[grid](ctx.get_device_context(), buf, rank=ctx.get_rank(), world_size=ctx.get_num_ranks())``
        """
        return self._device_context

    # -- symmetric objects and memory from other allocators ----------------------------------

    @functools.cached_property
    def _external(self) -> ExternalMemory:
        return ExternalMemory(self.backend, self.comm, self.heap, self._device, self._node_map)

    def allocate_symmetric(self, *size, dtype: torch.dtype | None = None):
        """A heap tensor and its peer-base table, the heap's bases: pass the table where a kernel takes
        ``heap_bases``, so the kernel runs unchanged over a registered tensor's table
        (:meth:`register_external_tensor`). Collective in effect: every rank allocates alike, in the same order.

        Args:
            size: the shape (``4, 8`` or ``(4, 8)``); or one dict ``{name: (shape, dtype) or shape}`` (a bare
                shape takes ``dtype``), allocated in the dict's order.
            dtype: the element type (None: torch's default, float32).

        Returns:
            ``(tensor, table)``; for a dict, ``{name: (tensor, table)}``.

        Example:
            >>> x, table = ctx.allocate_symmetric(1024, dtype=torch.float16)
            >>> bufs = ctx.allocate_symmetric({"data": ((64, 64), torch.bfloat16), "flags": (64, torch.int32)})
            >>> kernel[grid](x, table)
        """
        if len(size) == 1 and isinstance(size[0], dict):
            if not size[0]:
                raise ValueError("allocate_symmetric({}) names no tensor: give at least one {name: (shape, dtype)}")
            requests = {}
            for name, value in size[0].items():
                shape, kind = value if isinstance(value, tuple) and len(value) == 2 and isinstance(
                    value[1], torch.dtype) else (value, dtype or torch.get_default_dtype())
                try:
                    requests[name] = (normalize_size((shape,)), kind)
                except (TypeError, ValueError) as error:
                    raise TypeError(f"allocate_symmetric: entry {name!r} = {value!r} is neither a shape nor "
                                    f"(shape, dtype) with dtype a torch.dtype: {error}") from None
            return {name: (self.empty(shape, dtype=kind), self.heap_bases) for name, (shape, kind) in requests.items()}
        return self.empty(*size, dtype=dtype or torch.get_default_dtype()), self.heap_bases

    def register_external_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Collective: map every rank's ``tensor`` (made by any allocator; each rank its own, of one shape, stride
        and dtype, registered in the same order) into every peer, without a copy, and return its peer-base table.
        The mappings last until :meth:`deregister_external_tensor` or :meth:`close`; the context holds ``tensor``
        until then. On the CPU backend the tensor must be in shared memory (``t.share_memory_()``); on GPUs in
        memory the CUDA/HIP IPC calls share (torch's caching allocator without expandable segments).

        Raises ValueError on every rank, before any mapping, where a rank's tensor cannot be shared or the
        tensors differ between ranks (naming them); RuntimeError on every rank where a mapping failed.

        Example:
            >>> x = torch.zeros(1024).share_memory_()
            >>> table = ctx.register_external_tensor(x)
            >>> kernel[grid](x, table)   # iris.store(x + offs, v, rank, peer, table) writes the peer's x
        """
        return self._external.register(tensor)

    def deregister_external_tensor(self, tensor: torch.Tensor) -> None:
        """Collective: unmap the peers' memory of a tensor :meth:`register_external_tensor` mapped; ValueError on
        every rank where a rank has not registered it. Example: ``ctx.deregister_external_tensor(x)``"""
        self._external.deregister(tensor)

    def as_symmetric(self, tensor: torch.Tensor, copy: bool = True) -> torch.Tensor:
        """A heap copy of ``tensor`` (same shape, dtype and values), usable from remote ranks; with
        ``copy=False``, ``tensor`` itself, registered (collective: :meth:`register_external_tensor`), its table
        given by :meth:`get_peer_bases`.

        Example:
            >>> x = ctx.as_symmetric(torch.arange(8))
            >>> y = ctx.as_symmetric(torch.zeros(8).share_memory_(), copy=False)
        """
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"as_symmetric takes a torch.Tensor; got {type(tensor).__name__} (torch.tensor(x) makes "
                            "one)")
        if copy:
            return super().as_symmetric(tensor)
        self.register_external_tensor(tensor)
        return tensor

    def get_peer_bases(self, tensor: torch.Tensor) -> torch.Tensor:
        """The peer-base table of ``tensor`` (or of the registered tensor or heap it lies in): pass it where a
        kernel takes ``heap_bases``. ValueError, before any launch, for a tensor neither registered nor on the heap.

        Example: ``kernel[grid](x, ctx.get_peer_bases(x))``
        """
        table = self._external.table_of(tensor) if "_external" in self.__dict__ else None
        if table is not None:
            return table
        if self.is_symmetric(tensor):
            return self.heap_bases
        raise ValueError("this tensor is neither on this context's heap nor registered: call "
                         "ctx.register_external_tensor(t) on every rank (zero-copy), or use ctx.as_symmetric(t) "
                         "for a heap copy")

    # -- host synchronization ----------------------------------------------------------------

    def barrier(self, stream=None, group=None) -> None:
        """Wait for this device (or only ``stream``), then for every rank of ``group`` (default: all).

        Example: ``ctx.barrier()``
        """
        self.backend.synchronize(self._device, stream)
        self.comm.barrier(group)
        self.team.raise_if_a_wait_timed_out()

    def device_barrier(self, group=None) -> None:
        """Every rank of ``group`` (default: all) waits here, on the device, in stream order: one small kernel
        whose release/acquire arrivals make writes of earlier kernels visible to every member after it. The host
        does not wait; the call can be captured in a CUDA graph.

        Args:
            group: a torch.distributed group whose members all call this (``dist.new_group(ranks)`` with its
                default backends: on GPUs a ``backend="gloo"`` group makes torch 2.11 hang in ``new_group``).

        Example:
            >>> kernel_that_puts[grid](...)
            >>> ctx.device_barrier()
            >>> kernel_that_reads[grid](...)
        """
        self.heap.refuse_if_closed("device_barrier")
        self.team.barrier(group)
        self.team.diagnose_now_in_debug()

    def broadcast(self, value, source_rank: int = 0, *, src: int | None = None):
        """Send ``value`` from rank ``source_rank`` (or ``src=``, torch.distributed's name) to every rank and
        return it. Tensors and numpy arrays come back as numpy arrays (a dtype numpy lacks, such as bfloat16,
        as a CPU tensor); scalars and other picklable objects keep their type.

        Example:
            >>> seed = ctx.broadcast(1234 if ctx.get_rank() == 0 else None, source_rank=0)
        """
        src = source_rank if src is None else src
        if self.cur_rank == src and isinstance(value, torch.Tensor):
            cpu = value.detach().cpu()
            try:
                value = cpu.numpy()
            except TypeError:
                value = cpu
        return self.comm.broadcast_object(value, src)

    # -- logging -----------------------------------------------------------------------------

    def debug(self, message: str) -> None:
        """Log at debug level as ``[Iris] [rank/world] message``."""
        log(_logging.DEBUG, message, self.cur_rank, self.num_ranks)

    def info(self, message: str) -> None:
        """Log at info level as ``[Iris] [rank/world] message``."""
        log(_logging.INFO, message, self.cur_rank, self.num_ranks)

    def warning(self, message: str) -> None:
        """Log at warning level as ``[Iris] [rank/world] message``."""
        log(_logging.WARNING, message, self.cur_rank, self.num_ranks)

    def error(self, message: str) -> None:
        """Log at error level as ``[Iris] [rank/world] message``."""
        log(_logging.ERROR, message, self.cur_rank, self.num_ranks)


    # -- clocks ------------------------------------------------------------------------------

    def wall_clock_rate(self, rank: int | None = None) -> int:
        """Ticks per millisecond (kHz) of the clock device timestamps read on ``rank``'s device (default: this
        rank's): 100000 on AMD (``s_memrealtime``), 1000000 on NVIDIA and the CPU backend (nanoseconds).
        ValueError for a rank outside the job.

        Example:
            >>> ms = (end_ticks - start_ticks) / ctx.wall_clock_rate(ctx.get_rank())
        """
        rank = self.cur_rank if rank is None else rank
        if isinstance(rank, bool) or not isinstance(rank, numbers.Integral) or not 0 <= rank < self.num_ranks:
            raise ValueError(f"wall_clock_rate(rank={rank!r}): give a rank in 0..{self.num_ranks - 1}")
        return self.backend.wall_clock_rate_khz(self.device_of(int(rank)))

    def device_of(self, rank: int) -> torch.device:
        """The device rank ``rank`` computes on, as this process names it (its place on its node picks it)."""
        return self.backend.device_for(node_local_index(self._node_map, rank))


def iris(heap_size: int = 1 << 30, allocator_type: str | None = None, debug: bool = False,
         heap: str | None = None) -> Iris:
    """Create this rank's Iris context (collective; see :class:`Iris`).

    Example:
        >>> ctx = iris.iris(1 << 30)
        >>> ctx = iris.iris(1 << 30, heap="shmem")   # an NVSHMEM heap, one rank per GPU
        >>> ctx = iris.iris(64 << 30, allocator_type="vmem")   # 64 GiB reserved, backed as allocations grow
    """
    return Iris(heap_size, allocator_type, debug, heap)


