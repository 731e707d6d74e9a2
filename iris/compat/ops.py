"""``iris.ops.FusedConfig`` with the original's tuning fields: a dataclass subclass of the native
:class:`iris.ops.config.FusedConfig` that :func:`install` makes the public name. The fields tuned the original's
own GEMM; Iris's kernels size and order their work themselves, so each is checked, kept and changes nothing.
An instance is a native config: every op takes it and keys its replay by its type and values.

Example:
    >>> ctx.ops.matmul_all_reduce(out, a, b, config=iris.ops.FusedConfig(block_size_n=128, num_sms=104))
"""

from __future__ import annotations

from dataclasses import dataclass

import iris.ops as ops_package
from iris.ops import config as native

#: The cache modifiers Triton's loads take (cache_modifier_a and cache_modifier_b).
LOAD_CACHE_MODIFIERS = (None, "", ".ca", ".cg", ".cv")
# (field, least value, None allowed) of the integer fields
_COUNTS = (("num_sms", 1, True), ("num_xcds", 1, False), ("chunk_size", 1, False),
           ("all_reduce_num_rings", 1, False), ("reduce_num_sms", 1, False))


@dataclass
class FusedConfig(native.FusedConfig):
    """:class:`iris.ops.config.FusedConfig` and the original's fields, checked and kept.

    Args:
        num_sms: None or >= 1. num_xcds (``iris.get_num_xcc()``), chunk_size, all_reduce_num_rings,
            reduce_num_sms: >= 1. cache_modifier_a/_b: in :data:`LOAD_CACHE_MODIFIERS`. allow_tf32, ksplit: bool.

    Example:
        >>> FusedConfig(num_sms=104, num_xcds=8).validate(world_size=2)
    """

    num_sms: int | None = None
    num_xcds: int = 1
    chunk_size: int = 1
    cache_modifier_a: str | None = ".ca"
    cache_modifier_b: str | None = ".ca"
    allow_tf32: bool = True
    all_reduce_num_rings: int = 1
    reduce_num_sms: int = 64
    ksplit: bool = False

    def __post_init__(self):
        native.check_counts(self, _COUNTS)
        for name in ("cache_modifier_a", "cache_modifier_b"):
            if getattr(self, name) not in LOAD_CACHE_MODIFIERS:
                raise ValueError(f"FusedConfig.{name}={getattr(self, name)!r}: must be one of "
                                 f"{', '.join(map(repr, LOAD_CACHE_MODIFIERS))}")
        for name in ("allow_tf32", "ksplit"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"FusedConfig.{name}={getattr(self, name)!r}: must be True or False")
        super().__post_init__()


def install() -> None:
    """Make :class:`FusedConfig` the public ``iris.ops.FusedConfig``."""
    ops_package.FusedConfig = FusedConfig


__all__ = ["FusedConfig", "LOAD_CACHE_MODIFIERS", "install"]
