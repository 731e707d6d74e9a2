"""A persistent Triton GEMM: ``out = a @ b (+ bias)``, bf16/fp16 operands, float32 accumulation.

The fused operations of :mod:`iris.ops` build on its pieces, so it lives here rather than in a GEMM library.
Programs walk output tiles in grouped order, so neighbours share operand tiles in L2. Triton's interpreter
runs one small tile and upcasts operands to float32, as its bfloat16 ``tl.dot`` is wrong.

Example:
    >>> a = torch.randn(1024, 512, dtype=torch.bfloat16, device="cuda")
    >>> b = torch.randn(512, 2048, dtype=torch.bfloat16, device="cuda")
    >>> out = iris.ops.matmul(a, b)                     # bf16 (1024, 2048)
    >>> out32 = iris.ops.matmul(a, b, out_dtype=torch.float32, bias=torch.zeros(2048, device="cuda"))
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
import triton.testing
from triton.runtime import _allocation

from iris import config
from iris.device import sync
from iris.host.replay.plans import bind
from iris.runtime import get_backend

OPERAND_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # float32: tl.dot's TF32 on GPUs
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The interpreter's one tile shape: tl.dot needs at least 16 in each dimension.
INTERPRETED_TILE = dict(BLOCK_M=32, BLOCK_N=32, BLOCK_K=32, GROUP_M=4)


@triton.jit
def tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(row, column) of the ``tile``-th output tile in grouped order."""
    per_group = GROUP_M * tiles_n
    first_m = (tile // per_group) * GROUP_M
    rows = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (tile % per_group) % rows, (tile % per_group) // rows


@triton.jit
def dot(x, y, acc, UPCAST: tl.constexpr):
    """``acc + x @ y`` in float32; ``UPCAST``: 16-bit operands multiplied as float32 (the CPU backend's interpreter
    needs it for bfloat16)."""
    if UPCAST:
        x = x.to(tl.float32)
        y = y.to(tl.float32)
    return tl.dot(x, y, acc)


@triton.jit
def accumulate(acc, a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, rows, cols, UPCAST: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """``acc + a[rows, :K] @ b[:K, cols]`` in float32 (rows past M and columns past N read as zeros)."""
    ks = tl.arange(0, BLOCK_K)
    a_ptrs = a + rows[:, None].to(tl.int64) * stride_am + ks[None, :] * stride_ak
    b_ptrs = b + ks[:, None].to(tl.int64) * stride_bk + cols[None, :] * stride_bn
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - k * BLOCK_K
        x = tl.load(a_ptrs, mask=(rows[:, None] < M) & (ks[None, :] < left), other=0.0)
        y = tl.load(b_ptrs, mask=(ks[:, None] < left) & (cols[None, :] < N), other=0.0)
        acc = dot(x, y, acc, UPCAST)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def accumulate_described(acc, a, b, K, row, col, UPCAST: tl.constexpr, BLOCK_K: tl.constexpr, b_row):
    """``acc + a[row:, :K] @ b[b_row:b_row + K, col:]`` in float32, through tensor descriptors (zeros past edges)."""
    return accumulate_range(acc, a, b, K, row, col, 0, b_row, UPCAST, BLOCK_K)


@triton.jit
def accumulate_range(acc, a, b, length, row, col, a_col, b_row, UPCAST: tl.constexpr, BLOCK_K: tl.constexpr):
    """``acc + a[row:, a_col:a_col + length] @ b[b_row:b_row + length, col:]`` in float32, through tensor
    descriptors (zeros past the tensors' edges; ``length`` a multiple of BLOCK_K unless it ends at an edge)."""
    for k in range(0, tl.cdiv(length, BLOCK_K)):
        x = a.load([row, a_col + k * BLOCK_K])
        y = b.load([b_row + k * BLOCK_K, col])
        acc = dot(x, y, acc, UPCAST)
    return acc


@triton.jit
def operand(pointer, rows, cols, stride_row, TMA: tl.constexpr, BLOCK_ROWS: tl.constexpr,
            BLOCK_COLS: tl.constexpr):
    """A row-major operand as :func:`tile_product` reads it: the pointer, or with ``TMA`` a tensor descriptor.
    Make it once per program, outside the tile loop."""
    if TMA:
        source = tl.make_tensor_descriptor(pointer, shape=[rows, cols], strides=[stride_row, 1],
                                           block_shape=[BLOCK_ROWS, BLOCK_COLS])
    else:
        source = pointer
    return source


@triton.jit
def tile_product(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n, UPCAST: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TMA: tl.constexpr = False):
    """(float32 tile of ``a @ b``, its rows, its columns) for output tile (``tile_m``, ``tile_n``).

    With ``TMA``, ``a`` and ``b`` are :func:`operand`'s descriptors: Hopper's bulk loads beat masked loads.
    """
    rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if TMA:
        acc = accumulate_described(acc, a, b, K, tile_m * BLOCK_M, tile_n * BLOCK_N, UPCAST, BLOCK_K, 0)
    else:
        acc = accumulate(acc, a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, rows, cols, UPCAST,
                         BLOCK_K)
    return acc, rows, cols


@triton.jit
def add_bias(acc, bias, cols, N, HAS_BIAS: tl.constexpr):
    """``acc`` plus the bias row (float32) at ``cols`` when HAS_BIAS; columns past N add nothing."""
    if HAS_BIAS:
        acc += tl.load(bias + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    return acc


@triton.jit
def hand_over(acc, parts, ready, slot, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A K part of a tile, for the program that finishes the tile: into workspace slot ``slot``, then its flag.
    (The fused ops' K split; it needs every program resident. matmul's split kernel counts parts in instead:
    :func:`counted_in`.)"""
    place = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tl.store(parts + tl.cast(slot, tl.int64) * (BLOCK_M * BLOCK_N) + place, acc)
    tl.debug_barrier()  # every thread's stores of the part before its flag
    tl.atomic_xchg(ready + slot, 1, sem="release", scope="gpu")


@triton.jit
def take_over(acc, parts, ready, tile, tiles, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``acc`` (a tile's last K part) plus its other parts, each waited for; their flags cleared for the next call."""
    place = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    for part in range(0, SPLIT - 1):
        slot = part * tiles + tile
        sync.wait_until(ready + slot, "==", 1, scope="gpu")
        tl.debug_barrier()  # the acquire before any thread reads the part
        acc += tl.load(parts + tl.cast(slot, tl.int64) * (BLOCK_M * BLOCK_N) + place)
        tl.atomic_xchg(ready + slot, 0, sem="relaxed", scope="gpu")  # the next writer is the next call's kernel
    return acc


@triton.jit
def _slot(parts, slot, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The float32 (BLOCK_M, BLOCK_N) block of workspace slot ``slot`` in ``parts``: its pointers."""
    place = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    return parts + tl.cast(slot, tl.int64) * (BLOCK_M * BLOCK_N) + place


@triton.jit
def counted_in(acc, parts, arrived, tile, tiles, part, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """K part ``part`` of a tile into its workspace slot, then counted in at the tile; whether this program's part
    was the tile's last to arrive (then this program sums the tile: :func:`summed_parts`). No program waits."""
    tl.store(_slot(parts, part * tiles + tile, BLOCK_M, BLOCK_N), acc)
    tl.debug_barrier()  # every thread's stores of the part before the count
    before = tl.atomic_add(arrived + tile, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()  # the acquire before any thread reads the other parts
    return before == SPLIT - 1


@triton.jit
def summed_parts(parts, arrived, tile, tiles, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A tile's K parts summed in part order (the same sum whichever program arrived last); its count cleared for
    the next call (whose kernel runs after this one)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for part in range(0, SPLIT):
        acc += tl.load(_slot(parts, part * tiles + tile, BLOCK_M, BLOCK_N))
    tl.atomic_xchg(arrived + tile, 0, sem="relaxed", scope="gpu")
    return acc


@triton.jit
def _gemm_kernel(a, b, out, bias, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om, stride_on,
                 HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    for tile in range(tl.program_id(0), tiles_m * tiles_n, tl.num_programs(0)):
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        acc, rows, cols = tile_product(a, b, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, tile_m, tile_n,
                                       UPCAST, BLOCK_M, BLOCK_N, BLOCK_K)
        store_tile(acc, out, bias, rows, cols, M, N, stride_om, stride_on, HAS_BIAS)


@triton.jit
def store_tile(acc, out, bias, rows, cols, M, N, stride_om, stride_on, HAS_BIAS: tl.constexpr):
    """A float32 tile (``rows`` x ``cols`` of an (M, N) output at ``out``) plus the bias, stored in out's dtype."""
    acc = add_bias(acc, bias, cols, N, HAS_BIAS)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tl.store(out + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on, acc.to(out.dtype.element_ty),
             mask=mask)


@triton.jit
def _split_gemm_kernel(a, b, out, bias, parts, ready, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_om,
                       stride_on, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr, TMA: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                       SPLIT: tl.constexpr):
    """The persistent GEMM with each tile's K range in ``SPLIT`` parts (more work units than tiles where the tiles
    are fewer than the SMs: decode shapes). Unit u is part u // tiles of tile u % tiles; every part goes to the
    workspace and is counted in at its tile (``ready``: one count per tile), and the program whose part arrives
    last sums the tile's parts in order and stores it. No program waits for another, so a grid of any size is
    safe, whether or not its programs are all resident. ``TMA``: ``a`` and ``b`` are descriptors."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    tiles_n = tl.cdiv(N, BLOCK_N)
    tiles = tiles_m * tiles_n
    per_part = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT) * BLOCK_K
    a_tiles = operand(a, M, K, stride_am, TMA, BLOCK_M, BLOCK_K)
    b_tiles = operand(b, K, N, stride_bk, TMA, BLOCK_K, BLOCK_N)
    for unit in range(tl.program_id(0), tiles * SPLIT, tl.num_programs(0)):
        tile = unit % tiles
        part = unit // tiles
        tile_m, tile_n = tile_of(tile, tiles_m, tiles_n, GROUP_M)
        rows = tile_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tile_n * BLOCK_N + tl.arange(0, BLOCK_N)
        first = part * per_part
        length = tl.minimum(K - first, per_part)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if TMA:
            acc = accumulate_range(acc, a_tiles, b_tiles, length, tile_m * BLOCK_M, tile_n * BLOCK_N, first, first,
                                   UPCAST, BLOCK_K)
        else:
            acc = accumulate(acc, a + tl.cast(first, tl.int64) * stride_ak, b + tl.cast(first, tl.int64) * stride_bk,
                             M, N, length, stride_am, stride_ak, stride_bk, stride_bn, rows, cols, UPCAST, BLOCK_K)
        if SPLIT > 1:
            if counted_in(acc, parts, ready, tile, tiles, part, SPLIT, BLOCK_M, BLOCK_N):
                acc = summed_parts(parts, ready, tile, tiles, SPLIT, BLOCK_M, BLOCK_N)
                store_tile(acc, out, bias, rows, cols, M, N, stride_om, stride_on, HAS_BIAS)
        else:
            store_tile(acc, out, bias, rows, cols, M, N, stride_om, stride_on, HAS_BIAS)


def _hopper_configs() -> list[triton.Config]:
    """Tile shapes for bf16/fp16 on Hopper; valid on AMD."""
    shapes = [(128, 256, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 3), (128, 128, 64, 4, 4),
              (128, 128, 64, 8, 4), (64, 256, 64, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4)]
    return [triton.Config(dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8), num_warps=w, num_stages=s)
            for m, n, k, w, s in shapes]


def _span_needed(size: int) -> int:
    """The widest (or tallest) tile a dimension of ``size`` needs: rounded up to a power of two, at least 64."""
    return max(64, triton.next_power_of_2(size))


def _fitting(configs, named_args, **_):
    """The tile shapes no larger than the problem needs (all of them for big problems): fewer compiles."""
    m, n = named_args["M"], named_args["N"]
    fit = [c for c in configs if c.kwargs["BLOCK_M"] <= _span_needed(m) and c.kwargs["BLOCK_N"] <= _span_needed(n)]
    return fit or [min(configs, key=lambda c: c.kwargs["BLOCK_M"] * c.kwargs["BLOCK_N"])]


def _replayed_ms(kernel_call, quantiles):
    """The autotuners' timing: the calls replayed from a CUDA graph, back to back with L2 as the last call left it
    (as a model's GEMMs run), not Triton's default of launches with L2 flushed before each. On an H100 the default
    picked 256 x 128 tiles where 128 x 256 ones ran 6-9% faster replayed (M = 1024 and 4096, N = 8192)."""
    return triton.testing.do_bench_cudagraph(kernel_call, rep=20, quantiles=quantiles)


#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps) of the tiles for GPUs that none of the lists fits (IRIS_GEMM_FIT_TILES):
#: two stages each. On gfx942 (64 KiB of LDS per program) each compiles within it (tests/test_gpu_tiles.py): Triton's
#: AMD pipeliner holds one stage of a two-stage loop in LDS.
_LOW_MEMORY_SHAPES = [(256, 128, 64, 8), (128, 256, 64, 8), (128, 128, 64, 8), (128, 128, 64, 4), (64, 128, 64, 4),
                      (128, 64, 64, 4), (64, 64, 128, 4), (32, 64, 128, 4), (16, 64, 128, 4)]


def pipeline_bytes(backend, launch: dict, element_bytes: int) -> int:
    """Shared memory a GEMM tile's software pipeline takes on ``backend``'s GPUs: the copies of an A and a B tile
    its pipeliner keeps (``backend.pipeline_buffers``) for ``launch``'s BLOCK_M, BLOCK_N, BLOCK_K and num_stages.
    Example: ``pipeline_bytes(cuda, dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_stages=3), 2)`` -> 147456
    (what sm_90 compiles it to; 98304 on a HIP backend, what gfx942 does)."""
    tile_bytes = (launch["BLOCK_M"] + launch["BLOCK_N"]) * launch["BLOCK_K"] * element_bytes
    return backend.pipeline_buffers(launch["num_stages"]) * tile_bytes


def _rows_needed(m: int) -> int:
    """The tallest decode tile an M-row output needs: M rounded up to a power of two, at least 16."""
    return max(16, triton.next_power_of_2(m))


def _low_memory(named_args, split: bool) -> list[triton.Config]:
    """The two-stage tiles no taller than M needs (the smallest where none is), with SPLIT=1 for the split kernel."""
    fit = [(m, n, k, w) for m, n, k, w in _LOW_MEMORY_SHAPES if m <= _rows_needed(named_args["M"])]
    extra = dict(SPLIT=1) if split else {}
    return [triton.Config(dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8, **extra), num_warps=w, num_stages=2)
            for m, n, k, w in fit or [min(_LOW_MEMORY_SHAPES)]]


def fitted(prune, split: bool = False):
    """An autotuner's ``early_config_prune`` kept within the GPU's shared memory (IRIS_GEMM_FIT_TILES): of the
    tiles ``prune`` keeps, those whose pipeline (:func:`pipeline_bytes`) fits the GPU's shared memory per program,
    or, where none does, the two-stage tiles of :data:`_LOW_MEMORY_SHAPES` (``split``: for the split kernel).
    Without it a tile over the limit fails to launch and the autotuner passes over it: where every tile is over,
    the call raises OutOfResources. Example: ``fitted(_fitting)(configs, dict(a=a, M=16, N=8192))``."""
    def within(configs, named_args, **kwargs):
        kept = prune(configs, named_args, **kwargs)
        a, backend = named_args["a"], get_backend()
        limit = backend.shared_memory_per_program(a.device)
        fit = [c for c in kept if limit is None or pipeline_bytes(backend, c.all_kwargs(), a.element_size()) <= limit]
        return fit or _low_memory(named_args, split)
    return within


#: With IRIS_GEMM_TIMINGS_ON_DISK (read once, here) the autotuners' timings are kept on disk in Triton's cache
#: (autotune's ``cache_results``), keyed by the shape, the dtypes, the tiles tried and the GPU's architecture: each
#: rank of a job and each later run on the machine takes the tile timed first without compiling and timing every
#: candidate again
_TIMINGS_ON_DISK = config.gemm_timings_on_disk()


def _autotuner(configs: list, prune):
    """matmul's autotuner over ``configs``: keyed by M, N and K, the candidates left by ``prune`` timed replayed
    from a CUDA graph (:func:`_replayed_ms`), the timings kept on disk (``_TIMINGS_ON_DISK``).
    Example: ``_autotuner(_hopper_configs(), _fitting)(_gemm_kernel)``."""
    return triton.autotune(configs=configs, key=["M", "N", "K"], do_bench=_replayed_ms,
                           prune_configs_by={"early_config_prune": prune}, cache_results=_TIMINGS_ON_DISK)


# IRIS_GEMM_FIT_TILES is read once, here
_tuned_gemm_kernel = _autotuner(_hopper_configs(), fitted(_fitting) if config.gemm_fit_tiles() else _fitting)(
    _gemm_kernel)


#: Rows up to which matmul's tuned kernel takes the decode tiles: narrow in M, K split in parts where the tiles
#: are fewer than the SMs (the weights streamed once by many programs)
DECODE_ROWS = 128
#: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, SPLIT) of the decode tiles
_DECODE_SHAPES = [(16, 64, 128, 4, 4, 1), (16, 64, 128, 4, 4, 2), (16, 64, 128, 4, 4, 4), (16, 128, 128, 4, 4, 1),
                  (16, 128, 128, 4, 4, 2), (16, 128, 128, 4, 4, 4), (32, 64, 128, 4, 4, 2), (32, 128, 128, 4, 4, 2),
                  (64, 64, 128, 4, 4, 2), (64, 128, 64, 4, 4, 1), (64, 128, 64, 4, 4, 2), (64, 128, 128, 8, 3, 4),
                  (64, 128, 128, 4, 4, 1), (128, 64, 128, 4, 4, 1)]  # the last two: 0.96 and 0.94x cuBLAS at M = 128
_DECODE_CONFIGS = [triton.Config(dict(BLOCK_M=m, BLOCK_N=n, BLOCK_K=k, GROUP_M=8, SPLIT=split), num_warps=w,
                                 num_stages=stages) for m, n, k, w, stages, split in _DECODE_SHAPES]
_LARGE_CONFIGS = [triton.Config({**c.kwargs, "SPLIT": 1}, num_warps=c.num_warps, num_stages=c.num_stages)
                  for c in _hopper_configs()]


def _by_rows(configs, named_args, **kwargs):
    """The decode tiles no taller than M needs up to DECODE_ROWS rows (from 64 rows, the large tiles that fit too:
    at M = 128, N = 14336 a 64 x 256 tile beat every decode tile on an H100), the large tiles (fitted) above."""
    m = named_args["M"]
    large = _fitting([c for c in configs if c in _LARGE_CONFIGS], named_args)
    if m > DECODE_ROWS:
        return large
    decode = [c for c in configs if c in _DECODE_CONFIGS and c.kwargs["BLOCK_M"] <= _rows_needed(m)]
    usable = [c for c in decode if _uses_every_part(c.kwargs, named_args)]
    return (usable or decode[:1]) + ([c for c in large if c not in decode] if m >= 64 else [])


def _uses_every_part(tile: dict, named_args) -> bool:
    """Whether a decode tile is one the shape can use: no wider than N needs (past 64 columns) and its K range in
    no more parts than it has BLOCK_K blocks (a part with nothing to sum only costs a hand-over)."""
    n, k = named_args["N"], named_args["K"]
    return tile["BLOCK_N"] <= _span_needed(n) and tile["SPLIT"] <= triton.cdiv(k, tile["BLOCK_K"])


# a shape in both lists (64 x 128 x 64, no split) is tried once
_tuned_split_kernel = _autotuner(_DECODE_CONFIGS + [c for c in _LARGE_CONFIGS if c not in _DECODE_CONFIGS],
                                 fitted(_by_rows, split=True) if config.gemm_fit_tiles() else _by_rows)(
    _split_gemm_kernel)
_WORKSPACES: dict = {}  # device -> (parts, ready) of the split kernel, grown as needed
_DECODE_TILES = tuple((m, n, split) for m, n, _, _, _, split in _DECODE_SHAPES)


@functools.lru_cache(maxsize=256)
def _split_need(m: int, n: int, tiles: tuple) -> tuple[int, int]:
    """(float32 part elements, tile counts) the worst of ``tiles`` ((BLOCK_M, BLOCK_N, SPLIT) each) needs on an
    (m, n) output, where it splits K: worked out once per shape, not on every call."""
    counts = [(triton.cdiv(m, bm) * triton.cdiv(n, bn), split, bm * bn) for bm, bn, split in tiles if split > 1]
    return (max([1] + [count * split * area for count, split, area in counts]),
            max([1] + [count for count, _, _ in counts]))


def split_workspace(device: torch.device, m: int, n: int, tiles=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(parts, ready) for :func:`_split_gemm_kernel` on an (m, n) output under any of ``tiles`` (dicts of BLOCK_M,
    BLOCK_N and SPLIT; default: the decode tiles): float32 slots for every part of every tile, and a count per tile,
    zero (the kernel leaves them zero)."""
    parts, slots = _split_need(m, n, _DECODE_TILES if tiles is None else tuple(
        (t["BLOCK_M"], t["BLOCK_N"], t["SPLIT"]) for t in tiles))
    held = _WORKSPACES.get(device)
    if held is None or held[0].numel() < parts or held[1].numel() < slots:
        held = _WORKSPACES[device] = (torch.empty(parts, dtype=torch.float32, device=device),
                                      torch.zeros(slots, dtype=torch.int32, device=device))
    return held


def chosen_tile(tuned: bool) -> str:
    """The tile shape and pipeline of the last ``matmul`` by the tuned kernel (``tuned``, IRIS_GEMM_TUNED=1) or the
    default one, as its autotuner chose them ("" before any, and on the CPU backend, which tunes nothing); what a
    benchmark reports beside a figure. Example: ``chosen_tile(True)`` -> ``"BLOCK_M=16, BLOCK_N=64, ..."``."""
    remembered = _LAST.get(bool(tuned))
    if remembered is None or remembered.config is None:
        return ""
    return ", ".join(f"{k}={v}" for k, v in remembered.config.all_kwargs().items())


def tma_ready(backend, device: torch.device, *operands: torch.Tensor) -> bool:
    """Whether ``operands`` can be loaded through TMA descriptors here: the backend has them, and each is row-major
    with 16-byte aligned rows and base. Then Triton needs an allocator for the descriptors: one on ``device`` is
    installed unless one is set. Example: ``tma_ready(ctx.backend, A.device, A, B)``."""
    if not backend.tensor_descriptors:
        return False
    for t in operands:
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            return False
    _install_allocator(device)
    return True


def _install_allocator(device: torch.device) -> None:
    """Triton's allocator for kernels that need global memory at launch (TMA descriptors made in the kernel):
    one on ``device`` unless this thread has one."""
    current = getattr(_allocation, "_allocator", None)
    if current is None or isinstance(current.get(), _allocation.NullAllocator):
        triton.set_allocator(lambda size, alignment, stream: torch.empty(size, dtype=torch.int8, device=device))


def tile_count(m: int, n: int, tile: dict) -> int:
    """How many output tiles an (m, n) output has with ``tile`` (BLOCK_M, BLOCK_N, ...)."""
    return triton.cdiv(m, tile["BLOCK_M"]) * triton.cdiv(n, tile["BLOCK_N"])


def check_operands(what: str, a, b, out, bias, out_dtype) -> None:
    """Errors before any launch, naming the bad argument: ``a @ b (+ bias)`` into ``out`` (None: made later)."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise ValueError(f"{what}: {name} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}")
        if t.dtype not in OPERAND_DTYPES:
            raise TypeError(f"{what}: {name} has dtype {t.dtype}; supported: bfloat16, float16, float32")
    if a.dtype != b.dtype or a.device != b.device:
        raise TypeError(f"{what}: a and b must share dtype and device; got {a.dtype} on {a.device}, "
                        f"{b.dtype} on {b.device}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"{what}: a is {tuple(a.shape)} and b is {tuple(b.shape)}: inner sizes differ")
    if out_dtype not in OUT_DTYPES:
        raise TypeError(f"{what}: out_dtype {out_dtype} is not one of float32, bfloat16, float16")
    shape = (a.shape[0], b.shape[1])
    if out is not None and (not isinstance(out, torch.Tensor) or tuple(out.shape) != shape
                            or out.dtype != out_dtype or out.device != a.device):
        raise ValueError(f"{what}: out must be {shape} {out_dtype} on {a.device}; got "
                         f"{tuple(getattr(out, 'shape', ()))} {getattr(out, 'dtype', type(out).__name__)} on "
                         f"{getattr(out, 'device', None)}")
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != shape[1] or bias.device != a.device):
        raise ValueError(f"{what}: bias must be 1-D of length {shape[1]} on {a.device}; got "
                         f"{tuple(bias.shape)} on {bias.device}")


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, bias: torch.Tensor | None = None,
           out_dtype: torch.dtype | None = None, programs: int | None = None) -> torch.Tensor:
    """``a @ b (+ bias)`` with the package's persistent GEMM; returns ``out``.

    Args:
        a: (M, K), bfloat16 or float16, any strides.
        b: (K, N), the same dtype, any strides (a transposed view is fine).
        out: (M, N) to write into; made when None.
        bias: optional (N,) added to every row (in float32, before the cast to ``out``'s dtype).
        out_dtype: float32, bfloat16 or float16 (default: ``out``'s dtype, else ``a``'s).
        programs: on a GPU, at most this many persistent programs (default: one per compute unit).
    """
    tuned = config.gemm_tuned()
    key = _call_key(a, b, out, bias, out_dtype, programs, tuned)
    remembered = _LAUNCHES.get(key)
    if remembered is None:  # checked, launched through the autotuner, remembered
        return _first_call(a, b, out, bias, out_dtype, programs, tuned, key)
    if out is None:
        out = torch.empty(remembered.out_shape, dtype=remembered.out_dtype, device=a.device)
    remembered.launch(a, b, out, bias)
    _LAST[tuned] = remembered
    return out


def _call_key(a, b, out, bias, out_dtype, programs, tuned) -> tuple | None:
    """What a call's launch depends on and its checks read: each tensor's device, dtype, shape, strides and
    whether its address is 16-byte aligned (Triton compiles in the integers and that alignment); None where an
    argument is not a tensor (the first call's checks name it)."""
    key = [tuned, programs, out_dtype]
    for t in (a, b, out, bias):
        if t is None:
            key.append(None)
        elif isinstance(t, torch.Tensor):
            key += (t.device, t.dtype, t.shape, t.stride(), t.data_ptr() % 16)
        else:
            return None
    return tuple(key)


def _first_call(a, b, out, bias, out_dtype, programs, tuned, key) -> torch.Tensor:
    """A call of a kind not seen before: its checks, its launch (on GPUs through the autotuner, which times the
    fitting tiles once per shape), and the launch remembered under ``key`` for the calls to come."""
    out_dtype = out_dtype or (out.dtype if out is not None else getattr(a, "dtype", None))
    check_operands("matmul", a, b, out, bias, out_dtype)
    M, K = a.shape
    N = b.shape[1]
    if out is None:
        out = torch.empty((M, N), dtype=out_dtype, device=a.device)
    if M == 0 or N == 0:
        return out
    sizes = (M, N, K, *a.stride(), *b.stride(), *out.stride())
    backend = get_backend()
    constexprs = dict(HAS_BIAS=bias is not None, UPCAST=backend.upcasts_narrow_floats)
    if not backend.compiles_kernels:  # the interpreter: nothing to autotune, one small tile
        constexprs.update(INTERPRETED_TILE)
        remembered = _Launch(_gemm_kernel, (min(tile_count(M, N, INTERPRETED_TILE), 4),), constexprs, None, (),
                             sizes, False, None, out)
        remembered.launch(a, b, out, bias)
    else:
        units = backend.compute_unit_count(a.device)
        programs = units if programs is None else max(1, min(programs, units))

        def grid(meta):
            return (min(programs, tile_count(M, N, meta) * meta.get("SPLIT", 1)),)

        tma = False
        if tuned:
            tma = tma_ready(backend, a.device, a, b)
            kernel, workspace, constexprs["TMA"] = _tuned_split_kernel, split_workspace(a.device, M, N), tma
        else:
            kernel, workspace = _tuned_gemm_kernel, ()
        call = (a, b, out, out if bias is None else bias, *workspace, *sizes)
        kernel[grid](*call, **constexprs)
        chosen = kernel.best_config
        launch_grid = grid(chosen.kwargs)
        bound = bind(kernel.fn, launch_grid, *call, **constexprs, **chosen.all_kwargs())
        remembered = _Launch(kernel.fn, launch_grid, constexprs, bound, workspace, sizes, tma, chosen, out)
    if key is not None:
        if len(_LAUNCHES) >= MAX_LAUNCHES:
            _LAUNCHES.clear()
        _LAUNCHES[key] = remembered
    _LAST[tuned] = remembered
    return out


class _Launch:
    """How matmul launches one kind of call (see :func:`_call_key`): on GPUs its kernel bound once with the
    autotuner's choice (:func:`iris.host.replay.plans.bind`) and relaunched with each call's addresses, skipping
    the autotuner's and Triton's per-call Python (about 35 us a call on an H100 host, as long as a decode-sized
    GEMM's kernel); on the interpreter, Triton's own launch. With it: the split kernel's workspace, the sizes and
    strides (the same for every call of the kind), whether it loads through TMA descriptors, the chosen
    configuration (None on the interpreter), and the output's shape and dtype (for calls that pass no ``out``)."""

    __slots__ = ("kernel", "grid", "constexprs", "bound", "workspace", "sizes", "fixed", "tma", "config",
                 "out_shape", "out_dtype")

    def __init__(self, kernel, grid, constexprs, bound, workspace, sizes, tma, chosen, out):
        self.kernel, self.grid, self.constexprs, self.bound = kernel, grid, constexprs, bound
        self.workspace, self.sizes, self.tma, self.config = workspace, sizes, tma, chosen
        self.fixed = tuple(t.data_ptr() for t in workspace) + sizes  # the launch's values after the four operands
        self.out_shape, self.out_dtype = tuple(out.shape), out.dtype

    def launch(self, a, b, out, bias) -> None:
        bias = out if bias is None else bias  # any pointer: the kernel reads no bias without HAS_BIAS
        if self.bound is None:
            self.kernel[self.grid](a, b, out, bias, *self.workspace, *self.sizes, **self.constexprs)
            return
        if self.tma:
            _install_allocator(a.device)  # per thread (Triton's allocator is a context variable)
        self.bound.launch_values((a.data_ptr(), b.data_ptr(), out.data_ptr(), bias.data_ptr()) + self.fixed)


_LAUNCHES: dict = {}  # key (see matmul) -> _Launch; emptied past MAX_LAUNCHES
MAX_LAUNCHES = 512
_LAST: dict = {}  # tuned (bool) -> the _Launch of the last call: what chosen_tile reports

