"""The original's ``iris.ccl`` names on the native collectives: ``Config`` with its tuning fields, ``AUTOTUNE``, and
``all_to_all_v``'s column form by position. :func:`install` makes ``Config`` and ``AUTOTUNE`` the public names, in
``iris.ccl`` and in the original's module ``iris.ccl.config``; the configs native code makes stay native.

Example:
    >>> ctx.ccl.all_gather(out, x, config=iris.ccl.Config(comm_sms=64, block_size_m=iris.ccl.AUTOTUNE))
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

import iris.ccl as ccl_package
from iris.ccl import CCL
from iris.ccl import all_to_all_v as a2av
from iris.ccl import config as native
from iris.host.team import check_call

# read once, before install() binds this module's names in their place
_native_all_to_all_v = CCL.all_to_all_v


class _Autotune:
    """The type of :data:`AUTOTUNE`."""

    def __repr__(self):
        return "AUTOTUNE"


AUTOTUNE = _Autotune()
"""A Config field's value "to be tuned": ``Config(block_size_m=AUTOTUNE)``; Iris takes the field's default."""


@dataclass
class Config(native.CollectiveConfig):
    """:class:`iris.ccl.config.Config` and the original's fields, checked and kept; none changes how Iris runs
    (Iris sizes each launch by the message, runs its Triton kernels and one ring per program). A field set to
    :data:`AUTOTUNE` takes its default.

    Args:
        comm_sms, num_xcds (None: 1), all_reduce_num_rings, num_warps: ints >= 1. chunk_size: None:
            ``min(swizzle_size ** 2, comm_sms // num_xcds)``. all_reduce_ring_slice_n: a power of two dividing
            block_size_n (None: block_size_n). threads_per_warp: 32 or 64. use_gluon, num_stages, waves_per_eu.

    Example:
        >>> Config(comm_sms=48, use_gluon=True).chunk_size   # 16: min(4 ** 2, 48 // 1)
    """

    comm_sms: int = 64
    num_xcds: int | None = None
    chunk_size: int | None = None
    use_gluon: bool = False
    all_reduce_num_rings: int = 1
    all_reduce_ring_slice_n: int | None = None
    num_stages: int = 1
    num_warps: int = 4
    threads_per_warp: int = 64
    waves_per_eu: int = 0

    @classmethod
    def autotune(cls, **fixed) -> Config:
        """A Config with every field but ``fixed`` set to :data:`AUTOTUNE`: ``Config.autotune(comm_sms=64)``."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(fixed) - names
        if unknown:
            raise TypeError(f"Config.autotune: no such field {sorted(unknown)}")
        return cls(**{name: fixed.get(name, AUTOTUNE) for name in names})

    def __post_init__(self):
        for f in dataclasses.fields(self):  # the native fields too: their checks below see the defaults
            if getattr(self, f.name) is AUTOTUNE:
                setattr(self, f.name, f.default)
        super().__post_init__()
        if self.num_xcds is None:
            self.num_xcds = 1
        for name in ("comm_sms", "num_xcds", "all_reduce_num_rings", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Config.{name}={value!r}: must be a positive int")
        if self.chunk_size is None:
            self.chunk_size = min(self.swizzle_size ** 2, max(1, self.comm_sms // self.num_xcds))
        if self.all_reduce_ring_slice_n is None:
            self.all_reduce_ring_slice_n = self.block_size_n
        slice_n = self.all_reduce_ring_slice_n
        if not isinstance(slice_n, int) or isinstance(slice_n, bool) or slice_n < 1 or slice_n & (slice_n - 1):
            raise ValueError(f"Config.all_reduce_ring_slice_n={slice_n!r}: must be a power of two (an int >= 1)")
        if self.block_size_n % slice_n:
            raise ValueError(f"Config.all_reduce_ring_slice_n={slice_n}: must divide "
                             f"block_size_n={self.block_size_n}")
        if self.threads_per_warp not in (32, 64):
            raise ValueError(f"Config.threads_per_warp={self.threads_per_warp!r}: must be 32 or 64")


def original_positionals(fifth, sixth) -> bool:
    """Whether ``all_to_all_v``'s fifth and sixth positional arguments are the original's ``group`` and ``async_op``
    (after the split sizes), not receive counts and displacements: a process group fifth, or a bool sixth."""
    group = dist.is_available() and isinstance(fifth, dist.ProcessGroup)
    return group or (fifth is None and isinstance(sixth, bool))


def is_column_call(output, input, third, fourth, recv_counts, recv_displs) -> bool:
    """Whether ``all_to_all_v(output, input, third, fourth)`` gives columns by split sizes (output's, input's), not
    MPI's send counts and displacements: two (M, columns) tensors, two lists of ints summing to the output's and the
    input's columns, ``fourth`` not the packed displacements of ``third``, no receive counts or displacements."""
    if recv_counts is not None or recv_displs is not None or fourth is None:
        return False
    if not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in (output, input)):
        return False
    if not all(isinstance(v, (list, tuple)) and all(isinstance(c, int) for c in v) for v in (third, fourth)):
        return False
    packed = [sum(third[:i]) for i in range(len(third))]
    return sum(fourth) == input.shape[1] and sum(third) == output.shape[1] and list(fourth) != packed


def all_to_all_v(self, output_tensor, input_tensor, send_counts=None, send_displs=None, recv_counts=None,
                 recv_displs=None, group=None, async_op=False, config=None, *, output_split_sizes=None,
                 input_split_sizes=None):
    """``ctx.ccl.all_to_all_v`` with the original's forms: columns by split sizes, by position or keyword (then
    ``group``, ``async_op``, ``config`` may follow them), go to :func:`iris.ccl.all_to_all_v.all_to_all_v_columns`;
    rows, MPI's Alltoallv (``group`` may come fifth), to the native method.

    Example:
        >>> ctx.ccl.all_to_all_v(out, x, [8, 16], [24, 24])          # columns: x is (M, 48), out (M, 24)
        >>> ctx.ccl.all_to_all_v(out, x, [4, 4], [0, 4], [4, 4], [0, 4])   # rows
    """
    if original_positionals(recv_counts, recv_displs):  # its (group, async_op, config) after the sizes
        recv_counts, recv_displs, group, async_op, config = None, None, recv_counts, \
            async_op if recv_displs is None else recv_displs, config if group is None else group
    if output_split_sizes is None and input_split_sizes is None and not is_column_call(
            output_tensor, input_tensor, send_counts, send_displs, recv_counts, recv_displs):
        if send_counts is None:
            raise TypeError("all_to_all_v: send_counts (or output_split_sizes and input_split_sizes) is required")
        return _native_all_to_all_v(self, output_tensor, input_tensor, send_counts, send_displs, recv_counts,
                                    recv_displs, group=group, async_op=async_op, config=config)
    if output_split_sizes is None and input_split_sizes is None:
        output_split_sizes, input_split_sizes = send_counts, send_displs
    elif send_counts is not None or send_displs is not None:
        raise TypeError("all_to_all_v: give either send_counts (rows) or output_split_sizes and "
                        "input_split_sizes (columns), not both")
    check_call(self._ctx.team, "all_to_all_v", {"output columns": output_split_sizes, "group": group,
                                                 "async_op": async_op, "config": config})
    a2av.all_to_all_v_columns(output_tensor, input_tensor, self._ctx, output_split_sizes, input_split_sizes,
                              group=group, async_op=async_op, config=config)


def install() -> None:
    """Make :class:`Config` and :data:`AUTOTUNE` the public names in ``iris.ccl`` and ``iris.ccl.config``."""
    for module in (ccl_package, native):
        module.Config, module.AUTOTUNE = Config, AUTOTUNE
    CCL.all_to_all_v = all_to_all_v


__all__ = ["AUTOTUNE", "Config", "all_to_all_v", "install", "is_column_call", "original_positionals"]
