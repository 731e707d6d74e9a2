"""Which device a rank uses, and how many XCCs (chiplets) a device has: the original's
``iris.get_device_id_for_rank`` and ``iris.get_num_xcc``.

Example:
    >>> torch.cuda.set_device(iris.get_device_id_for_rank(local_rank))
    >>> iris.get_num_xcc()      # 8 on an MI300X, 1 on NVIDIA GPUs and the CPU backend
"""

from __future__ import annotations

import ctypes
import functools
import numbers

import torch

from iris import runtime

#: hipDeviceAttributeNumberOfXccs in ROCm 7's hipDeviceAttribute_t (ROCm 6's enum has no such entry).
HIP_ATTRIBUTE_XCC_COUNT = 10018

#: XCCs of the AMD architectures that have several, where the device cannot be asked (ROCm 6): MI300X/MI325X
#: (gfx942) and MI350/MI355X (gfx950) have 8; a device partitioned (CPX) reports fewer through the attribute.
XCC_COUNT_BY_ARCH = {"gfx942": 8, "gfx950": 8}


def get_device_id_for_rank(local_rank: int) -> int:
    """The index of the device a rank with local rank ``local_rank`` uses, as ``iris.iris()`` picks it.

    Ranks wrap around the node's devices (rank r on device r % devices), which is what several
    simulated ranks per GPU need and the identity where there is one rank per GPU; the CPU backend
    has one device, 0.

    Args:
        local_rank: the rank's index on its node (LOCAL_RANK), >= 0.

    Returns:
        int: the device index.

    Raises:
        TypeError: ``local_rank`` is not an integer. ValueError: it is negative.

    Example:
        >>> torch.cuda.set_device(iris.get_device_id_for_rank(int(os.environ.get("LOCAL_RANK", 0))))
    """
    if isinstance(local_rank, bool) or not isinstance(local_rank, numbers.Integral):
        raise TypeError(f"get_device_id_for_rank(local_rank={local_rank!r}): give the rank's index on its node")
    if local_rank < 0:
        raise ValueError(f"get_device_id_for_rank(local_rank={local_rank!r}): a local rank is >= 0")
    return runtime.get_backend().device_for(int(local_rank)).index or 0


def get_num_xcc(device_id: int | None = None) -> int:
    """How many XCCs (accelerator complex dies) the device has: 1 off AMD (NVIDIA GPUs, the CPU backend).

    On AMD, ROCm 7 and later are asked (hipDeviceGetAttribute, hipDeviceAttributeNumberOfXccs); where
    they cannot be, the architecture's count (:data:`XCC_COUNT_BY_ARCH`, else 1). Fused kernels tuned
    for AMD use it to spread tiles over the dies.

    Args:
        device_id: a device index (default: the current device).

    Returns:
        int: the number of XCCs, >= 1.

    Example:
        >>> config = iris.ccl.Config(num_xcds=iris.get_num_xcc())
    """
    backend = runtime.get_backend()
    if backend.name != "hip":
        return 1
    index = torch.cuda.current_device() if device_id is None else int(device_id)
    return _hip_xcc_count_of(index)


@functools.lru_cache(maxsize=None)
def _hip_xcc_count_of(index: int) -> int:
    lib = getattr(runtime.get_backend().runtime, "lib", None)
    arch = torch.cuda.get_device_properties(index).gcnArchName
    return hip_xcc_count(lib, index, torch.version.hip, arch)


def hip_xcc_count(lib, index: int, hip_version: str | None, arch: str) -> int:
    """The XCC count of AMD device ``index``: asked of the HIP runtime ``lib`` (a ctypes library) from ROCm 7,
    else (or where it refuses) :data:`XCC_COUNT_BY_ARCH` for ``arch`` (``gcnArchName``, e.g. ``gfx942:sramecc+``).

    Example:
        >>> hip_xcc_count(None, 0, "6.4", "gfx942")
        8
    """
    major = int(str(hip_version).split(".")[0]) if hip_version and str(hip_version)[0].isdigit() else 0
    if lib is not None and major >= 7:
        count = ctypes.c_int(0)
        try:
            status = lib.hipDeviceGetAttribute(ctypes.byref(count), ctypes.c_int(HIP_ATTRIBUTE_XCC_COUNT),
                                               ctypes.c_int(index))
        except (AttributeError, OSError):
            status = -1
        if status == 0 and count.value > 0:
            return count.value
    return XCC_COUNT_BY_ARCH.get(arch.split(":")[0], 1)
