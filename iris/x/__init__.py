"""iris.x: communication inside your own ``@triton.jit`` kernels, a tile at a time: the tile's place
(:mod:`iris.x.core`), its collectives (:mod:`iris.x.collectives`), GEMM + communication tile ops
(:mod:`iris.x.gemm`), the KV-cache exchange (:mod:`iris.x.kv`) and prefill attention over a cache paged across
ranks (:mod:`iris.x.prefill_attn`), with ROCm/iris's names; the ranks come from the
device context, which importing iris.x gives the collectives, GEMM ops and KV exchange as methods too.

Example (inside a kernel; the whole program: examples/17_gemm_all_reduce_epilogue):
    >>> ctx = iris.TritonContext.initialize(context, rank, world_size)
    >>> ctx.all_reduce(iris.x.TileView(pid_m, pid_n, BM, BN), src, dst, config=iris.x.AllReduceConfig("ring"))
"""

from iris.x.collectives import (
    all_gather,
    all_reduce_atomic,
    all_reduce_one_shot,
    all_reduce_ring,
    all_reduce_spinlock,
    all_reduce_two_shot,
    all_to_all,
    broadcast,
    gather,
    mark_tile_ready,
    publish_tile,
    reduce_scatter,
    wait_tile_ready,
)
from iris.x.core import (AllReduceConfig, Tile, TensorView, TileView, make_tensor_view, offset_ptr, tile_layout,
                         tile_ptr)
from iris.x.gemm import all_gather_gemm, gemm_all_gather, gemm_all_reduce, gemm_reduce_scatter, gemm_tile
from iris.x.kv import send_kv, recv_kv, wait_kv
from iris.x import prefill_attn  # noqa: F401  (iris.x.prefill_attn: its device steps and host calls by module)

all_reduce = all_reduce_atomic  # the default variant, by the plain name

__all__ = [
    "Tile", "TileView", "TensorView", "AllReduceConfig", "make_tensor_view", "tile_layout", "tile_ptr", "offset_ptr",
    "all_gather", "all_reduce", "all_reduce_atomic", "all_reduce_one_shot", "all_reduce_two_shot", "all_reduce_ring",
    "all_reduce_spinlock", "reduce_scatter", "all_to_all", "broadcast", "gather", "publish_tile", "mark_tile_ready",
    "wait_tile_ready", "gemm_tile", "gemm_all_reduce", "gemm_reduce_scatter", "gemm_all_gather", "all_gather_gemm",
    "send_kv", "wait_kv", "recv_kv",
]
