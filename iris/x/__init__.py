"""iris.x: communication inside your own kernels, a tile at a time.

Where ``iris.ccl`` launches whole collectives, ``iris.x`` gives device functions to call from a
``@triton.jit`` kernel of yours on one tile of a 2-D tensor: the tile's place (:mod:`iris.x.core`:
``TileView``, ``Tile``, ``TensorView``, ``make_tensor_view``, ``tile_layout``, ``tile_ptr``, ``offset_ptr``)
and its collectives (:mod:`iris.x.collectives`: ``all_gather``, ``all_reduce_atomic``, ``all_reduce_one_shot``,
``all_reduce_two_shot``, ``all_reduce_spinlock``, ``reduce_scatter``, ``all_to_all``, ``broadcast``, with
``publish_tile``, ``mark_tile_ready`` and ``wait_tile_ready`` for the flags between ranks). The names and
arguments are the original's (``iris.x`` of ROCm/iris); the ranks come from the device context
(``iris.DeviceContext.initialize(ctx.get_device_context(), rank, world_size)``).

Example: examples/17_gemm_all_reduce_epilogue, and the guide docs/guides/tile-collectives.md.
"""

from iris.x.collectives import (
    all_gather,
    all_reduce_atomic,
    all_reduce_one_shot,
    all_reduce_spinlock,
    all_reduce_two_shot,
    all_to_all,
    broadcast,
    mark_tile_ready,
    publish_tile,
    reduce_scatter,
    wait_tile_ready,
)
from iris.x.core import Tile, TensorView, TileView, make_tensor_view, offset_ptr, tile_layout, tile_ptr

all_reduce = all_reduce_atomic  # the original's default

__all__ = [
    "Tile", "TileView", "TensorView", "make_tensor_view", "tile_layout", "tile_ptr", "offset_ptr",
    "all_gather", "all_reduce", "all_reduce_atomic", "all_reduce_one_shot", "all_reduce_two_shot",
    "all_reduce_spinlock", "reduce_scatter", "all_to_all", "broadcast", "publish_tile", "mark_tile_ready",
    "wait_tile_ready",
]
