"""The torch dtypes the properties draw from, and values that survive a bytewise comparison."""

from __future__ import annotations

import torch

# Every torch dtype Triton loads and stores (complex types have no Triton equivalent).
LOAD_STORE_DTYPES = (
    torch.bool, torch.int8, torch.uint8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn,
    torch.float8_e5m2,
)

_SIGNED_TWIN = {torch.uint16: torch.int16, torch.uint32: torch.int32, torch.uint64: torch.int64}


def values(dtype: torch.dtype, count: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` random values of ``dtype`` (CPU) whose bytes a load/store moves unchanged.

    Integers span their whole range; floats are finite numbers (no NaN, whose payload an
    emulated load may canonicalize); bools are 0 or 1 (a load of bool reads any non-zero byte as 1).
    """
    if dtype == torch.bool:
        return torch.randint(0, 2, (count,), generator=generator).bool()
    if dtype.is_floating_point:
        return (torch.randn(count, generator=generator) * 8).to(dtype)
    if dtype in _SIGNED_TWIN:
        return values(_SIGNED_TWIN[dtype], count, generator).view(dtype)
    info = torch.iinfo(dtype)
    if dtype == torch.int64:
        high = torch.randint(-(2**31), 2**31, (count,), generator=generator, dtype=torch.int64)
        low = torch.randint(0, 2**32, (count,), generator=generator, dtype=torch.int64)
        return high * (2**32) + low
    return torch.randint(info.min, info.max + 1, (count,), generator=generator, dtype=dtype)


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def short_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
