"""A drop-in all-reduce for inference engines (vLLM, SGLang): :class:`AllReduce`, the contract of their custom
all-reduce over ``ctx.ccl.all_reduce``: one heap buffer of ``max_bytes`` made up front (collective), ``should_use``,
and an out-of-place ``all_reduce`` that allocates nothing on the heap afterwards, so a CUDA graph records the same
addresses on every replay. Every rank makes the same calls in the same order.

Example:
    >>> comm = iris.inference.AllReduce(max_bytes=8 << 20)      # once, on every rank
    >>> y = comm.all_reduce(x) if comm.should_use(x) else None  # y: the sum over ranks, x unchanged
"""

from __future__ import annotations

import torch

from iris.ccl.all_reduce import all_reduce_to_new

#: Bytes per rank above which NCCL is as fast as Iris's copy-in path (benchmarks/ccl.py measures it)
NCCL_ABOVE = 128 << 20

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class AllReduce:
    """An all-reduce (sum) over ``group`` (a torch.distributed group; None: every rank) of tensors up to ``max_bytes``
    through Iris, with the engines' contract; above ``nccl_above`` bytes (default :data:`NCCL_ABOVE`) through
    ``torch.distributed``. ``ctx`` None: a context is made for it. Example: ``AllReduce(max_bytes=1 << 20)``."""

    def __init__(self, group=None, max_bytes: int = 8 << 20, ctx=None, nccl_above: int | None = None):
        if not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0:
            raise ValueError(f"iris.inference.AllReduce: max_bytes={max_bytes!r}; give a positive number of bytes")
        self._owns_context = ctx is None
        if ctx is None:
            import iris

            ctx = iris.iris(max(1 << 26, 2 * max_bytes))
        self.ctx = ctx
        self.group = group
        self.max_bytes = max_bytes
        self.nccl_above = NCCL_ABOVE if nccl_above is None else nccl_above
        self.device = ctx.get_device()
        self.world_size = ctx.get_num_ranks() if group is None else torch.distributed.get_world_size(group)
        self._buffer = ctx.empty(max_bytes, dtype=torch.uint8)  # registered once: the calls that copy, copy into it

    def should_use(self, tensor: torch.Tensor) -> bool:
        """Whether :meth:`all_reduce` runs ``tensor`` through Iris: contiguous, bf16/fp16/fp32, on this rank's device,
        at most ``max_bytes`` and ``nccl_above`` bytes (the same answer on every rank for the same shape and dtype)."""
        nbytes = tensor.numel() * tensor.element_size()
        return (tensor.is_contiguous() and tensor.dtype in DTYPES and tensor.device == self.device
                and 0 < nbytes <= min(self.max_bytes, self.nccl_above))

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over the group's ranks of ``tensor``, as a new tensor (``tensor`` unchanged)."""
        if not self.should_use(tensor):
            out = tensor.clone()
            torch.distributed.all_reduce(out, group=self.group)
            return out
        return all_reduce_to_new(tensor, self.ctx, self._stage, group=self.group)

    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        return self._buffer[:nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)

    def close(self) -> None:
        """Close the context it made (collective); a context it was given stays open."""
        self._buffer = None
        if self._owns_context:
            self.ctx.close()
