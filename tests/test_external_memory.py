"""Memory from other allocators, zero-copy, and symmetric allocations with their peer-base tables.

One kernel, written once, runs over a heap tensor with ``ctx.allocate_symmetric``'s table and over a tensor
made elsewhere with ``ctx.register_external_tensor``'s table: each rank reads its peer's first half through the
table and writes it, plus one, into the peer's second half. Refusals come on every rank (no rank hangs), and
deregistration and ``close`` unmap what registration mapped.
"""

import ctypes
import os

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.runtime import SELECTED, get_backend

N = 24  # elements per half: one program of BLOCK with masked tail lanes
BLOCK = 32
POISON = -7


def _data(seed: int, rank: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    return torch.randint(-(2**20), 2**20, (N,), generator=g, dtype=torch.int32)


@triton.jit
def _swap_halves_kernel(x, out, n, peer, table, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    rank = iris.current_rank(table)  # the table carries the rank, as the heap's bases do
    got = iris.load(x + offs, rank, peer, table, mask=mask)
    tl.store(out + offs, got, mask=mask)
    iris.store(x + n + offs, got + 1, rank, peer, table, mask=mask)


def _fill(x: torch.Tensor, seed: int, rank: int) -> None:
    x[:N] = _data(seed, rank)
    x[N:] = POISON


def _swap(ctx, x, table, seed):
    """Run the kernel over ``x`` and ``table``; what this rank read from its peer and what its peer wrote here."""
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    peer = (rank + 1) % world
    _fill(x, seed, rank)
    out = torch.full((N,), POISON, dtype=torch.int32, device=x.device)
    ctx.barrier()
    _swap_halves_kernel[(1,)](x, out, N, peer, table, BLOCK=BLOCK)
    ctx.barrier()
    return dict(rank=rank, peer=peer, read=out.cpu(), landed=x[N:].cpu().clone(), own=x[:N].cpu().clone())


def _check_swapped(results, world, seed):
    for got in results:
        prev = (got["rank"] - 1) % world
        assert torch.equal(got["own"], _data(seed, got["rank"]))
        assert torch.equal(got["read"], _data(seed, got["peer"])), got["rank"]
        assert torch.equal(got["landed"], _data(seed, got["rank"]) + 1), (got["rank"], prev)


# ------------------------------------------------------------------ allocate_symmetric


def _allocate_symmetric_on_rank(seed):
    ctx = iris.iris(1 << 20)
    x, table = ctx.allocate_symmetric(2 * N, dtype=torch.int32)
    facts = dict(symmetric=ctx.is_symmetric(x), shape=tuple(x.shape), dtype=x.dtype,
                 heap_table=table.data_ptr() == ctx.get_heap_bases().data_ptr(),
                 lookup=ctx.get_peer_bases(x[3:]).data_ptr() == table.data_ptr())
    default, _ = ctx.allocate_symmetric(2, 3)
    facts["default"] = (tuple(default.shape), default.dtype)
    # a heap tensor registered: no mapping, the table is each rank's heap base plus the tensor's offset
    offset = x.data_ptr() - ctx.heap.base
    registered = ctx.register_external_tensor(x)
    facts["registered_heap"] = registered.tolist() == [b + offset for b in ctx.get_heap_bases().tolist()]
    facts["as_symmetric_heap"] = ctx.as_symmetric(x, copy=False) is x
    facts.update(_swap(ctx, x, table, seed))
    ctx.close()
    return facts


def test_allocate_symmetric_gives_a_heap_tensor_and_the_heaps_table(ranks):
    results = ranks.run(_allocate_symmetric_on_rank, 5)
    for got in results:
        assert got["symmetric"] and got["heap_table"] and got["lookup"]
        assert got["shape"] == (2 * N,) and got["dtype"] == torch.int32
        assert got["default"] == ((2, 3), torch.float32)
        assert got["registered_heap"] and got["as_symmetric_heap"]
    _check_swapped(results, ranks.world_size, 5)


def _allocate_map_on_rank(seed):
    ctx = iris.iris(1 << 20)
    got = ctx.allocate_symmetric({"x": (2 * N, torch.int32), "flags": ((2, 4), torch.int64), "w": (3, 5)},
                                 dtype=torch.float16)
    facts = {name: (tuple(t.shape), t.dtype, ctx.is_symmetric(t), b.data_ptr() == ctx.get_heap_bases().data_ptr())
             for name, (t, b) in got.items()}
    facts["names"] = list(got)
    refusals = []
    for bad in ({"x": (4, "int32")}, {"x": "big"}, {}):
        try:
            ctx.allocate_symmetric(bad)
        except (TypeError, ValueError) as error:
            refusals.append(str(error))
    x, table = got["x"]
    facts.update(_swap(ctx, x, table, seed))
    ctx.close()
    return facts, refusals


def test_allocate_symmetric_by_name_gives_each_name_its_tensor_and_table(ranks):
    results = ranks.run(_allocate_map_on_rank, 6)
    for facts, refusals in results:
        assert facts["names"] == ["x", "flags", "w"]
        assert facts["x"] == ((2 * N,), torch.int32, True, True)
        assert facts["flags"] == ((2, 4), torch.int64, True, True)
        assert facts["w"] == ((3, 5), torch.float16, True, True)  # a bare shape takes dtype=
        assert len(refusals) == 3 and "'x'" in refusals[0] and "dtype" in refusals[0], refusals
        assert "'x'" in refusals[1] and "(shape, dtype)" in refusals[1] and "no tensor" in refusals[2], refusals
    _check_swapped([facts for facts, _ in results], ranks.world_size, 6)


# ------------------------------------------------------------------ register_external_tensor

cpu_only = pytest.mark.skipif(SELECTED != "cpu", reason="the CPU backend maps tensors shared by file descriptor")


def _register_on_rank(seed):
    ctx = iris.iris(1 << 20)
    rank = ctx.get_rank()
    x = torch.empty(2 * N, dtype=torch.int32).share_memory_()  # made outside Iris, not on the heap
    table = ctx.register_external_tensor(x)
    y = torch.zeros(4, dtype=torch.float64).share_memory_()
    same = ctx.as_symmetric(y, copy=False)
    facts = dict(on_heap=ctx.is_symmetric(x), as_symmetric_is_y=same is y, table_dtype=table.dtype,
                 own_base=int(table[rank]) == x.data_ptr(), distinct=len(set(table.tolist())) == len(table),
                 lookup=ctx.get_peer_bases(x[N:]).data_ptr() == table.data_ptr(),
                 again=ctx.register_external_tensor(x).data_ptr() == table.data_ptr())
    facts.update(_swap(ctx, x, table, seed))
    facts["x_after"] = x[N:].clone()  # the peer's write, seen through this rank's own tensor object
    ctx.close()
    return facts


@cpu_only
def test_a_shared_cpu_tensor_registered_is_read_and_written_by_its_peer_zero_copy(ranks):
    results = ranks.run(_register_on_rank, 7)
    for got in results:
        assert not got["on_heap"] and got["as_symmetric_is_y"] and got["table_dtype"] == torch.int64
        assert got["own_base"] and got["distinct"] and got["lookup"] and got["again"]
        assert torch.equal(got["x_after"], _data(7, got["rank"]) + 1)
    _check_swapped(results, ranks.world_size, 7)


def _refused(ctx, tensor):
    try:
        ctx.register_external_tensor(tensor)
    except ValueError as error:
        return str(error)
    return None


def _no_access(handle):
    raise OSError("Permission denied")


def _refusals_on_rank():
    ctx = iris.iris(1 << 20)
    rank = ctx.get_rank()
    private = torch.zeros(8) if rank == 1 else torch.zeros(8).share_memory_()  # private on rank 1 only
    shapes = torch.zeros(4 + rank).share_memory_()
    dtypes = torch.zeros(4, dtype=torch.float32 if rank == 0 else torch.int32).share_memory_()
    messages = dict(private=_refused(ctx, private), shapes=_refused(ctx, shapes), dtypes=_refused(ctx, dtypes),
                    unregistered=None, lookup=None, mapping=None)
    shared = torch.zeros(8).share_memory_()  # rank 1 cannot map its peer's: every rank raises, none keeps a mapping
    files = ctx.comm.all_gather_object(_file_of(shared))
    if rank == 1:
        ctx.backend.import_memory = _no_access
    try:
        ctx.register_external_tensor(shared)
    except RuntimeError as error:
        messages["mapping"] = str(error)
    finally:
        vars(ctx.backend).pop("import_memory", None)
    messages["left_mapped"] = [_mapped(f) for r, f in enumerate(files) if r != rank]
    try:
        ctx.deregister_external_tensor(torch.zeros(4).share_memory_())
    except ValueError as error:
        messages["unregistered"] = str(error)
    try:
        ctx.get_peer_bases(torch.zeros(4))
    except ValueError as error:
        messages["lookup"] = str(error)
    ctx.barrier()  # every rank came back: none waits on a peer that refused
    ctx.close()
    return messages


@cpu_only
def test_refusals_come_on_every_rank_before_any_mapping(ranks):
    for messages in ranks.run(_refusals_on_rank, timeout=120):
        assert messages["private"] and "rank 1" in messages["private"], messages
        assert "share_memory_()" in messages["private"] and "as_symmetric" in messages["private"], messages
        shapes = messages["shapes"]
        assert shapes and "shape" in shapes and "rank 0: (4,)" in shapes and "rank 1: (5,)" in shapes, shapes
        dtypes = messages["dtypes"]
        assert dtypes and "torch.float32" in dtypes and "torch.int32" in dtypes, dtypes
        assert messages["mapping"] and "rank 1 could not map rank 0's tensor" in messages["mapping"], messages
        assert "Permission denied" in messages["mapping"] and not any(messages["left_mapped"]), messages
        assert messages["unregistered"] and "not registered" in messages["unregistered"], messages
        assert messages["lookup"] and "register_external_tensor" in messages["lookup"], messages


def _file_of(tensor) -> str:
    """The /dev/shm file behind a tensor shared by file descriptor, as /proc/self/maps names it."""
    return os.readlink(f"/proc/self/fd/{tensor.untyped_storage()._get_shared_fd()}")


def _mapped(path: str) -> bool:
    with open("/proc/self/maps") as maps:
        return any(line.rstrip("\n").endswith(path) for line in maps)


class _CountedImports:
    """The backend's import_memory, counting the calls of the release callables it returns."""

    def __init__(self, backend):
        self.backend, self.released = backend, 0

    def __call__(self, handle):
        address, release = type(self.backend).import_memory(self.backend, handle)

        def counted():
            self.released += 1
            release()

        return address, counted


def _release_on_rank():
    ctx = iris.iris(1 << 20)
    rank, world = ctx.get_rank(), ctx.get_num_ranks()
    a, b = torch.zeros(64).share_memory_(), torch.ones(64).share_memory_()
    files = ctx.comm.all_gather_object((_file_of(a), _file_of(b)))
    peers = [files[r] for r in range(world) if r != rank]
    seen = {"before": [], "after_deregister": [], "after_close": []}
    imports = ctx.backend.import_memory = _CountedImports(ctx.backend)
    try:
        ctx.register_external_tensor(a)
        ctx.as_symmetric(b, copy=False)
        seen["before"] = [(_mapped(fa), _mapped(fb)) for fa, fb in peers]
        ctx.deregister_external_tensor(a)
        seen["after_deregister"] = [(_mapped(fa), _mapped(fb)) for fa, fb in peers]
        seen["released"] = [imports.released]
    finally:
        vars(ctx.backend).pop("import_memory", None)
    try:
        ctx.get_peer_bases(a)
        seen["lookup_after"] = None
    except ValueError as error:
        seen["lookup_after"] = str(error)
    ctx.close()
    seen["after_close"] = [(_mapped(fa), _mapped(fb)) for fa, fb in peers]
    seen["released"].append(imports.released)
    try:
        ctx.register_external_tensor(a)
        seen["closed"] = None
    except RuntimeError as error:
        seen["closed"] = str(error)
    return seen


@cpu_only
def test_deregistration_and_close_unmap_the_peers_memory(ranks):
    for seen in ranks.run(_release_on_rank):
        assert seen["before"] and all(pair == (True, True) for pair in seen["before"]), seen
        assert all(pair == (False, True) for pair in seen["after_deregister"]), seen
        assert all(pair == (False, False) for pair in seen["after_close"]), seen
        peers = len(seen["before"])
        assert seen["released"] == [peers, 2 * peers], seen  # each mapping released once, when it should be
        assert seen["lookup_after"] and "register_external_tensor" in seen["lookup_after"], seen
        assert seen["closed"] and "closed" in seen["closed"], seen


# ------------------------------------------------------------------ the backend's export and import


@cpu_only
def test_the_cpu_backend_exports_shared_memory_and_refuses_private_memory():
    backend = get_backend()
    shared = torch.arange(16, dtype=torch.int32).share_memory_()
    handle = backend.export_memory(shared[4:])  # a view: the handle carries its byte offset
    address, release = backend.import_memory(handle)
    try:
        values = list((ctypes.c_int32 * 4).from_address(address))
        ctypes.c_int32.from_address(address).value = 99  # the same pages: the exporter sees the write
    finally:
        release()
    assert values == [4, 5, 6, 7] and int(shared[4]) == 99
    with pytest.raises(ValueError, match=r"share_memory_\(\).*as_symmetric"):
        backend.export_memory(torch.arange(4))


class _FakeRuntime:
    """The GPU runtime calls the IPC backend's export and import make, recorded (no GPU here)."""

    def __init__(self):
        self.opened, self.closed = [], []

    def allocation_of(self, ptr):
        return 0x10000, 1 << 20

    def ipc_handle(self, base):
        return base.to_bytes(8, "little") * 8

    def open_ipc_handle(self, handle):
        if handle == bytes(64):
            raise RuntimeError("IpcOpenMemHandle failed")
        self.opened.append(handle)
        return 0x7000000

    def close_ipc_handle(self, ptr):
        self.closed.append(ptr)


def test_the_gpu_backends_export_the_allocation_and_open_each_handle_once():
    """The IPC backend's bookkeeping, with the runtime faked: the handle names the allocation and the tensor's
    offset in it; tensors of one allocation share one open handle, closed with the last release."""
    from types import SimpleNamespace

    from iris.runtime import backend_class

    backend = object.__new__(backend_class("cuda"))
    backend._runtime, backend._imported = _FakeRuntime(), {}
    tensor = SimpleNamespace(device=torch.device("cuda", 0), data_ptr=lambda: 0x10000 + 0x300)
    handle = backend.export_memory(tensor)
    assert handle == ((0x10000).to_bytes(8, "little") * 8, 0x300)
    (a, release_a), (b, release_b) = backend.import_memory(handle), backend.import_memory((handle[0], 0x40))
    assert (a, b) == (0x7000000 + 0x300, 0x7000000 + 0x40) and len(backend._runtime.opened) == 1
    release_a()
    assert backend._runtime.closed == []
    release_b()
    assert backend._runtime.closed == [0x7000000] and backend._imported == {}
    with pytest.raises(RuntimeError, match="IpcOpenMemHandle"):
        backend.import_memory((bytes(64), 0))
    assert backend._imported == {}  # a failed open leaves nothing to close
    with pytest.raises(ValueError, match="GPU memory only"):
        backend.export_memory(torch.zeros(2, device="cpu"))
