"""A drop-in all-reduce for inference engines: :class:`AllReduce`.

Engines (vLLM, SGLang) keep a custom all-reduce beside NCCL for the small tensors of tensor-parallel decoding:
buffers registered once at start, ``should_use(tensor)`` to pick it, an out-of-place ``all_reduce(tensor)``,
eager and inside CUDA-graph capture. This class is that contract over Iris's ``ctx.ccl.all_reduce``:

- one heap buffer of ``max_bytes``, made when the communicator is (a collective call on every rank); a call
  whose size's variant reads the input only on its own rank (push, ll: the small sizes) reads it where it is,
  any other copies it there, so nothing is allocated on the heap afterwards and a CUDA graph records the
  same addresses on every replay;
- the result is a new tensor (``torch.empty_like``; under capture it comes from the graph's pool), which the
  all-reduce writes directly where the variant writes only this rank's output, else a copy of the buffer;
- above ``nccl_above`` bytes the call goes to ``torch.distributed.all_reduce`` (NCCL on GPUs) on a copy,
  because NCCL is as fast there: by default the size from which NCCL matched Iris's copy-in path in
  ``benchmarks/ccl.py`` on 2 x H200 (see :data:`NCCL_ABOVE`).

Every rank must make the same calls in the same order, as with any collective.

Example:
    >>> import iris, torch
    >>> comm = iris.inference.AllReduce(max_bytes=8 << 20)      # once, on every rank
    >>> x = torch.randn(16, 4096, dtype=torch.bfloat16, device=comm.device)
    >>> y = comm.all_reduce(x) if comm.should_use(x) else None  # y: the sum over ranks, x unchanged
"""

from __future__ import annotations

import torch

from iris.ccl.all_reduce import all_reduce_to_new

#: Sizes (bytes per rank) from which the call goes to torch.distributed: where NCCL met or passed Iris's
#: copy-in path (copy into a heap buffer, then all_reduce) in benchmarks/ccl.py on 2 x H200 (bf16): Iris ahead
#: up to 64 MiB (213 against 251 us), level at 128 MiB (475 against 472), NCCL ahead at 256 MiB. Other
#: machines and world sizes take the same size until measured.
NCCL_ABOVE = 128 << 20

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


class AllReduce:
    """An all-reduce (sum) of tensors up to ``max_bytes`` through Iris, with the inference engines' contract.

    Args:
        group: the torch.distributed process group (None: every rank of the context).
        max_bytes: the largest tensor it takes, the size of the heap buffer made now.
        ctx: the Iris context (None: one made for this communicator, ``iris.iris`` with a heap that holds
            the buffer).
        nccl_above: tensors of more bytes than this go to ``torch.distributed.all_reduce``
            (default :data:`NCCL_ABOVE`).

    Example:
        >>> comm = AllReduce(max_bytes=1 << 20)
        >>> out = comm.all_reduce(torch.ones(1024, device=comm.device))   # == world size everywhere
    """

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
        """Whether :meth:`all_reduce` runs ``tensor`` through Iris: contiguous, bf16/fp16/fp32, on this rank's
        device, at most ``max_bytes`` and at most ``nccl_above`` bytes. Every rank gets the same answer for
        the same shape and dtype."""
        nbytes = tensor.numel() * tensor.element_size()
        return (tensor.is_contiguous() and tensor.dtype in DTYPES and tensor.device == self.device
                and 0 < nbytes <= min(self.max_bytes, self.nccl_above))

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over the group's ranks of ``tensor``, as a new tensor (``tensor`` is left as it is): through
        Iris where :meth:`should_use`, else through ``torch.distributed.all_reduce`` on a copy."""
        if not self.should_use(tensor):
            out = tensor.clone()
            torch.distributed.all_reduce(out, group=self.group)
            return out
        return all_reduce_to_new(tensor, self.ctx, self._stage, group=self.group)

    def _stage(self, tensor: torch.Tensor) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        return self._buffer[:nbytes].view(tensor.dtype).view(tensor.shape).copy_(tensor)

    def close(self) -> None:
        """Closes the context it made (collective: every rank calls it); a context it was given stays open, and
        the buffer's memory returns to the system with that context (the heap is a bump allocator)."""
        self._buffer = None
        if self._owns_context:
            self.ctx.close()
