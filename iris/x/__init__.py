"""iris.x: communication inside your own kernels, a tile at a time.

Where ``iris.ccl`` launches whole collectives, ``iris.x`` gives device functions to call from a
``@triton.jit`` kernel of yours on one tile of a 2-D tensor: the tile's place (:mod:`iris.x.core`:
``TileView``, ``Tile``, ``TensorView``, ``make_tensor_view``, ``tile_layout``, ``tile_ptr``, ``offset_ptr``),
its collectives (:mod:`iris.x.collectives`: ``all_gather``, ``gather``, ``all_reduce_atomic``,
``all_reduce_one_shot``, ``all_reduce_two_shot``, ``all_reduce_ring``, ``all_reduce_spinlock``,
``reduce_scatter``, ``all_to_all``, ``broadcast``, with ``publish_tile``, ``mark_tile_ready`` and
``wait_tile_ready`` for the flags between ranks) and ``AllReduceConfig``, the variant ``ctx.all_reduce`` runs.
The names and arguments are the original's (``iris.x`` of ROCm/iris); the ranks come from the device context
(``iris.DeviceContext.initialize(ctx.get_device_context(), rank, world_size)``, also ``iris.TritonContext``),
which importing iris.x gives the collectives as methods too.

Example (inside a ``@triton.jit`` kernel):
    >>> ctx = iris.TritonContext.initialize(context, rank, world_size)
    >>> tile = iris.x.TileView(pid_m, pid_n, BLOCK_M, BLOCK_N)
    >>> src = iris.x.make_tensor_view(input_ptr, M, N, stride_m, stride_n)
    >>> dst = iris.x.make_tensor_view(output_ptr, M, N, stride_m, stride_n)
    >>> ctx.all_reduce(tile, src, dst, config=iris.x.AllReduceConfig("ring"))  # or iris.x.all_reduce_ring(..., ctx)
    >>> ctx.all_gather(tile, src, gathered, 0)

The whole program: examples/17_gemm_all_reduce_epilogue; the guide: docs/guides/tile-collectives.md.
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

all_reduce = all_reduce_atomic  # the original's default

__all__ = [
    "Tile", "TileView", "TensorView", "AllReduceConfig", "make_tensor_view", "tile_layout", "tile_ptr", "offset_ptr",
    "all_gather", "all_reduce", "all_reduce_atomic", "all_reduce_one_shot", "all_reduce_two_shot", "all_reduce_ring",
    "all_reduce_spinlock", "reduce_scatter", "all_to_all", "broadcast", "gather", "publish_tile", "mark_tile_ready",
    "wait_tile_ready",
]
