"""What the fused GEMM + communication operations share on the host: checks, workspaces, launch sizes.

A fused op is one persistent kernel per rank. Its workspace (heap slots peers write, flags, counters) is a
*spec*, ``{name: Buffer}``, for one problem (op, output shape, dtype, tile); :class:`Workspace` holds the
tensors and the problem's key, which each call checks.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton

from iris import config as settings
from iris.device.barrier import FUSED_PROGRAMS
from iris.ops.config import FusedConfig
from iris.ops.gemm import INTERPRETED_TILE, check_operands, pipeline_bytes, tma_ready


@dataclass(frozen=True)
class Buffer:
    """One tensor of a workspace: ``numel`` elements of ``dtype``, on the heap (peers write it) or local."""

    numel: int
    dtype: torch.dtype
    heap: bool
    zeroed: bool = False  # counters: zero when made; data slots are overwritten before they are read


class Workspace:
    """The tensors of one fused op for one problem (``key``), as attributes by name: made collectively by the
    op's ``*_preamble`` or, on first use, by ``ctx.ops``; ``Workspace(key, tensors)`` wraps tensors made elsewhere."""

    def __init__(self, key: tuple, tensors: dict[str, torch.Tensor]):
        self.key = key
        self.tensors = tensors
        for name, tensor in tensors.items():
            setattr(self, name, tensor)

    @classmethod
    def allocate(cls, ctx, key: tuple, spec: dict[str, Buffer]) -> Workspace:
        tensors = {}
        for name, buf in spec.items():
            if buf.heap:
                tensors[name] = (ctx.zeros if buf.zeroed else ctx.empty)(max(buf.numel, 1), dtype=buf.dtype)
            else:
                tensors[name] = torch.zeros(max(buf.numel, 1), dtype=buf.dtype, device=ctx.get_device())
        return cls(key, tensors)


# Smaller tiles the default gives way to where it leaves most programs idle (decode-like M), and what K parts
# cost: times per tile relative to the default's, measured on H100 and H200 (bf16). Below SPLIT_MIN_ROWS rows
# the small tile's parts compete in place of the default's.
HALF_TILE = dict(block_size_n=128)
HALF_TILE_COST = 0.88
SMALL_TILE = dict(block_size_m=64, block_size_n=128, num_warps=4, num_stages=4)
SMALL_TILE_COST = 0.53
SPLIT_COST = 0.15  # a part: 1 / S of the tile plus this (a float32 tile handed over through the workspace)
SPLIT_MIN_ROWS = 256
SPLITS = (1, 2, 4)
_TILE_FIELDS = ("block_size_m", "block_size_n", "block_size_k", "group_size_m", "num_warps", "num_stages")


def fitted_launch(config: FusedConfig, rows: int, cols: int, programs: int, dtype: torch.dtype,
                  splits: tuple[int, ...] | None = None, within: tuple | None = None) -> dict:
    """The tile constexprs and launch options (BLOCK_M/N/K, GROUP_M, num_warps, num_stages, and SPLIT where
    ``splits``, the K splits the caller's kernel takes, is given) for an (rows, cols) output on ``programs``
    concurrent programs. A tile set by hand is used as set; the default gives way to :data:`HALF_TILE`,
    :data:`SMALL_TILE` or (unless ``config.split_k`` is set) a tile cut in K parts, whichever finishes its waves
    soonest at its cost per tile. float32 operands take half the K depth (the same shared memory as 16 bits).
    ``within``, (backend, bytes) of a GPU's shared memory per program (IRIS_GEMM_FIT_TILES): the candidates whose
    pipeline (``iris.ops.gemm.pipeline_bytes``) needs more are passed over, the default tile at fewer stages taken
    where none fits, and a tile set by hand that does not fit is refused (ValueError) before any launch.

    Example:
        >>> fitted_launch(FusedConfig(), 128, 8192, 132, torch.bfloat16)["BLOCK_M"]   # 32 tiles: too few
        64
        >>> fitted_launch(FusedConfig(), 128, 14336, 132, torch.bfloat16)["BLOCK_N"]  # 56: 112 half tiles, one wave
        128
        >>> fitted_launch(FusedConfig(), 256, 8192, 132, torch.bfloat16, SPLITS)["SPLIT"]  # 64 tiles, 128 halves
        2
    """
    fitted = splits is not None and config.split_k is None
    split = config.split_k or 1
    if within is not None:
        backend, limit = within

        def need(tile: FusedConfig) -> int:
            return pipeline_bytes(backend, _launch(tile, dtype), dtype.itemsize)
    if all(getattr(config, name) == getattr(FusedConfig, name) for name in _TILE_FIELDS):
        def cost(tile: FusedConfig, per_tile: float, parts: int) -> float:
            tiles = triton.cdiv(rows, tile.block_size_m) * triton.cdiv(cols, tile.block_size_n)
            return triton.cdiv(tiles * parts, programs) * (per_tile / parts + (SPLIT_COST if parts > 1 else 0.0))

        candidates = [(config, 1.0, 1), (replace(config, **HALF_TILE), HALF_TILE_COST, 1),
                      (replace(config, **SMALL_TILE), SMALL_TILE_COST, 1)]
        cut = candidates[0] if rows >= SPLIT_MIN_ROWS else candidates[2]  # the tile whose K parts compete
        candidates += [(cut[0], cut[1], parts) for parts in (splits if fitted else ()) if parts > 1]
        if within is not None:  # those that fit, else the default tile at the most stages that fit (if any)
            fewer = (replace(config, num_stages=s) for s in range(config.num_stages - 1, 0, -1))
            candidates = ([c for c in candidates if need(c[0]) <= limit]
                          or [(next((c for c in fewer if need(c) <= limit), config), 1.0, 1)])
        config, _, chosen = min(candidates, key=lambda candidate: cost(*candidate))  # min keeps the first of equals
        split = chosen if fitted else split
    if within is not None and need(config) > limit:
        raise ValueError(f"FusedConfig tile {config.block_size_m} x {config.block_size_n} x {config.block_size_k} in "
                         f"{config.num_stages} stages needs {need(config)} bytes of shared memory per program; this "
                         f"GPU has {limit}: take fewer stages or a smaller tile")
    launch = _launch(config, dtype)
    return launch if splits is None else dict(launch, SPLIT=split)


def _launch(config: FusedConfig, dtype: torch.dtype) -> dict:
    """The constexprs and launch options of ``config``'s tile for ``dtype`` operands (float32: half the K depth)."""
    depth = max(16, config.block_size_k // 2) if dtype == torch.float32 else config.block_size_k
    return dict(BLOCK_M=config.block_size_m, BLOCK_N=config.block_size_n, BLOCK_K=depth,
                GROUP_M=config.group_size_m, num_warps=config.num_warps, num_stages=config.num_stages)


def split_last_round(tiles: int, programs: int, choices) -> tuple[int, int]:
    """(whole, parts): the first ``whole`` of ``tiles`` output tiles whole, each of the last round's (on ``programs``
    concurrent programs) in ``parts`` K parts, the one of ``choices`` that finishes that round soonest.

    Example:
        >>> split_last_round(448, 128, SPLITS)   # 3 rounds whole, then 64 tiles in halves: 128 programs busy
        (384, 2)
    """
    rest = tiles - (triton.cdiv(tiles, programs) - 1) * programs

    def cost(parts: int) -> float:
        return triton.cdiv(rest * parts, programs) * (1 / parts + (SPLIT_COST if parts > 1 else 0.0))

    parts = min(choices, key=cost)
    return (tiles, 1) if parts == 1 else (tiles - rest, parts)


def tile(ctx, config: FusedConfig, dtype: torch.dtype, rows: int, cols: int,
         splits: tuple[int, ...] | None = None) -> dict:
    """The tile and launch options of one call with an (rows, cols) output: :func:`fitted_launch` for
    this rank's concurrent programs on a GPU; the interpreter's own small tile on the CPU backend (K split
    only as ``config.split_k`` says)."""
    backend = ctx.team.backend
    if not backend.compiles_kernels:
        launch = dict(INTERPRETED_TILE, num_warps=config.num_warps, num_stages=config.num_stages)
        return launch if splits is None else dict(launch, SPLIT=config.split_k or 1)
    within = None
    if settings.gemm_fit_tiles():  # IRIS_GEMM_FIT_TILES
        within = (backend, backend.shared_memory_per_program(ctx.get_device()))
    return fitted_launch(config, rows, cols, concurrent_programs(ctx), dtype, splits, within)


# FusedConfig(tma_loads=None) takes the descriptors from this many rows of A (faster there on H200, not below)
TMA_AUTO_ROWS = 2048


def tma_loads(ctx, config: FusedConfig, A: torch.Tensor, B: torch.Tensor) -> bool:
    """Whether this call loads its operand tiles through TMA descriptors (FusedConfig.tma_loads, None:
    where A has TMA_AUTO_ROWS rows or more): asked for, not on AMD, and both operands row-major with
    16-byte aligned rows and base. Then Triton needs an allocator for the descriptors; one on the
    context's device is installed unless one is set."""
    wanted = config.tma_loads if config.tma_loads is not None else A.shape[0] >= TMA_AUTO_ROWS
    return wanted and tma_ready(ctx.team.backend, ctx.get_device(), A, B)


def sm_share(ctx) -> int:
    """This rank's share of its GPU's SMs (compute units): all of them, or, in simulation (rank r on GPU
    r % devices), an equal part for each of the most ranks any GPU holds, so that every rank gets the same."""
    sharing = -(-ctx.get_num_ranks() // max(1, ctx.backend.device_count()))
    return max(1, ctx.get_cu_count() // sharing)


def concurrent_programs(ctx) -> int:
    """Programs of one launch this rank can count on running at once: one per SM of :func:`sm_share` (a tile
    fills an SM's shared memory; the same on every rank, which pair program p), at most FUSED_PROGRAMS (one
    barrier slot each); 1 where a launch's programs run in turn."""
    return 1 if ctx.team.backend.runs_programs_in_turn else min(FUSED_PROGRAMS, sm_share(ctx))


def launch_size(ctx, tiles: int) -> int:
    """Programs of one fused launch: one per tile up to :func:`concurrent_programs`, at least one."""
    return max(1, min(tiles, concurrent_programs(ctx)))


def check(what: str, ctx, output, A, B, bias, output_shape, symmetric_output: bool) -> None:
    """Errors before any launch: the GEMM's operands, the output's shape, device and (if peers write it) heap.

    ``output_shape(M, K, N)``: the output's shape for ``A`` (M, K) and ``B`` (K, N).
    """
    check_operands(what, A, B, None, None, getattr(output, "dtype", None))
    output_shape = output_shape(A.shape[0], A.shape[1], B.shape[1])
    if not isinstance(output, torch.Tensor) or tuple(output.shape) != tuple(output_shape):
        raise ValueError(f"{what}: output must have shape {tuple(output_shape)}; got "
                         f"{tuple(getattr(output, 'shape', ())) or type(output).__name__}")
    if A.device != ctx.get_device() or output.device != ctx.get_device():
        raise ValueError(f"{what}: the operands are on {A.device} and the output on {output.device}; this rank's "
                         f"device is {ctx.get_device()}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dim() != 1
                             or bias.shape[0] != B.shape[1] or bias.device != A.device):
        raise ValueError(f"{what}: bias must be 1-D of length {B.shape[1]} (B's columns) on {A.device}; got "
                         f"{tuple(getattr(bias, 'shape', ()))} on {getattr(bias, 'device', None)}")
    if symmetric_output:
        ctx.team.check_tensor(what, "output", output, (torch.float32, torch.bfloat16, torch.float16), True)


def workspace_for(ctx, what: str, key: tuple, spec: dict[str, Buffer], workspace) -> Workspace:
    """``workspace`` if it was made for ``key``; the one ``ctx.ops`` keeps for ``key`` when None."""
    if workspace is None:
        return ctx.ops.kept_workspace(key, lambda: Workspace.allocate(ctx, key, spec))
    if not isinstance(workspace, Workspace) or workspace.key != key:
        raise ValueError(f"{what}: this workspace was made for another problem ({getattr(workspace, 'key', None)}); "
                         f"this call needs {key}: make it with ctx.ops.{what}_preamble(...) with the same "
                         "tensors' shapes and config")
    return workspace


def barrier_arguments(ctx) -> tuple:
    """(members, count, index, cur, heap_bases, arrivals, expected) of every fused kernel: all ranks."""
    members = ctx.team.participants(None)
    arrivals, expected, _, _ = ctx.team.barrier.arguments(None)
    return (members.tensor, members.size, members.index, ctx.get_rank(), ctx.get_heap_bases(), arrivals, expected)


def vendor_dtype_refusal(output, A) -> str | None:
    """Why FusedConfig(vendor_gemm=True) cannot write ``output``, or None: torch's GEMM writes A's dtype."""
    if isinstance(output, torch.Tensor) and isinstance(A, torch.Tensor) and output.dtype != A.dtype:
        return (f"FusedConfig(vendor_gemm=True) writes output in A's dtype ({A.dtype}) through torch's GEMM; output "
                f"has {output.dtype}: pass an output of A's dtype, or vendor_gemm=False")
    return None


def copy_refusal(ctx) -> str | None:
    """Why FusedConfig(copy_engine=True) cannot run in this job, or None: every member's heap must be mapped
    here (none reached only through the engine, across nodes), and on GPUs each rank must have its own:
    ranks sharing one (IRIS_SIMULATION) would copy inside it, where a copy may need the SMs the kernel
    holds while it waits for the copy."""
    if not ctx.team.heap.maps():
        return ("FusedConfig(copy_engine=True) copies into every member's heap, and a member here is reached only "
                "through the engine (another node); use copy_engine=False")
    if ctx.team.backend.has_copy_engine:
        nodes = ctx.get_node_map()
        devices = [(nodes[rank], ctx.device_of(rank)) for rank in range(ctx.get_num_ranks())]
        if len(set(devices)) < len(devices):
            return ("FusedConfig(copy_engine=True) needs one GPU per rank; here ranks share a GPU "
                    "(IRIS_SIMULATION?), where a copy could wait for the SMs the kernel holds. Use copy_engine=False")
    return None


def side_stream(device: torch.device):
    """The stream of a fused op's work beside its kernels on ``device`` (copy_engine's copies, the pipeline's chunk
    sums): one of two per process and device, never the current one (torch's pool of 32 streams hands a capture
    or user stream out again every 32 draws; forked onto itself, the side work would wait for the kernels).

    Example:
        >>> side = side_stream(A.device)       # the same stream for the same current stream: fork, then join
        >>> side.wait_stream(torch.cuda.current_stream())
    """
    first, second = _side_streams(device)
    return second if first == torch.cuda.current_stream(device) else first


@functools.cache
def _side_streams(device: torch.device) -> tuple:
    """Two different streams from torch's pool (a pool of one stream gives it twice: the work then runs in order)."""
    first = torch.cuda.Stream(device)
    draws = (torch.cuda.Stream(device) for _ in range(64))
    return first, next((stream for stream in draws if stream != first), first)


@functools.cache
def _one(device: torch.device) -> torch.Tensor:
    """An int64 1 in host memory that the copies of arrival flags read (pinned where a GPU reads it)."""
    return torch.ones(1, dtype=torch.int64, pin_memory=device.type != "cpu")


def peer_address(ctx, tensor: torch.Tensor, member: int, offset: int = 0) -> int:
    """The address, in this process, of heap tensor ``tensor``'s place (plus ``offset`` bytes) in rank
    ``member``'s heap (mapped here: :func:`copy_refusal` says where it is not)."""
    return ctx.team.heap.peer_address(tensor.data_ptr() + offset, member)


def flag_set(ctx, flags: torch.Tensor, member: int, position: int) -> tuple:
    """(dst, src, size): the copy that sets ``flags[position]`` to 1 in rank ``member``'s heap."""
    return (peer_address(ctx, flags, member, position * flags.element_size()), _one(flags.device).data_ptr(),
            flags.element_size())


def copied(ctx, transfers: list, flags: torch.Tensor, device: torch.device) -> tuple:
    """(send, finish): ``send`` queues ``transfers``, (dst, src, size) copies in order (a flag after its data), on a
    side stream where the backend has streams (the copy engine runs them beside the next kernel; elsewhere they
    run at once); ``finish`` clears this rank's ``flags`` on the current stream and joins the side stream."""
    backend = ctx.backend

    def send():
        stream = None
        if backend.has_streams:
            stream = side_stream(device)
            stream.wait_stream(torch.cuda.current_stream())
        for dst, src, size in transfers:  # in order on one stream: a member's data lands before its flag
            backend.copy(dst, src, size, stream)

    def finish():
        flags.zero_()
        if backend.has_streams:
            torch.cuda.current_stream().wait_stream(side_stream(device))

    return send, finish


def sent_by_copies(ctx, source: torch.Tensor, slots: torch.Tensor, flags: torch.Tensor) -> tuple:
    """(send, finish) of FusedConfig.copy_engine (:func:`copied`): copy ``source`` into this rank's slot of
    ``slots`` on every other member, then set that member's flag; clear this rank's flags after the kernel.

    Example:
        >>> send, finish = sent_by_copies(ctx, A_shard, workspace.gathered, workspace.flags)
        >>> launches = [ctx.team.barrier.launch(None), send, kernel_launch, finish]
    """
    members = ctx.team.participants(None)
    nbytes = source.numel() * source.element_size()
    # member by member, from the next one on (every rank starts at a different member), each one's data then its flag
    transfers = []
    for step in range(1, members.size):
        member = members.ranks[(members.index + step) % members.size]
        transfers += [(peer_address(ctx, slots, member, members.index * nbytes), source.data_ptr(), nbytes),
                      flag_set(ctx, flags, member, members.index)]
    return copied(ctx, transfers, flags, source.device)


def standalone(op: str, operand: str = "A"):
    """(``op``, ``op``_preamble) with the context first, as standalone functions: each calls ``ctx.ops.<op>``
    (returning the workspace) or its preamble.

    Example:
        >>> matmul_all_reduce, matmul_all_reduce_preamble = standalone("matmul_all_reduce")
    """

    def call(ctx, output, A, B, bias=None, async_op=False, config=None, workspace=None) -> Workspace:
        return getattr(ctx.ops, op)(output, A, B, bias, async_op, config, workspace)

    def preamble(ctx, output, A, B, config=None) -> Workspace:
        return getattr(ctx.ops, f"{op}_preamble")(output, A, B, config)

    for function, name in ((call, op), (preamble, f"{op}_preamble")):
        function.__name__ = function.__qualname__ = name
        function.__module__ = f"iris.ops.{op}"
        function.__doc__ = (f"``ctx.ops.{name}(ctx, output, {operand}, B, ...)`` with the context first (a "
                            "standalone form); see :mod:`iris.ops`.")
    return call, preamble
