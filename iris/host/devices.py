"""Which device a rank uses, and how many XCCs (chiplets) a device has: ``iris.get_device_id_for_rank`` and
``iris.get_num_xcc``.

Example:
    >>> torch.cuda.set_device(iris.get_device_id_for_rank(local_rank))
    >>> iris.get_num_xcc()      # 8 on an MI300X, 1 on NVIDIA GPUs and the CPU backend
"""

from __future__ import annotations

import numbers

from iris import runtime


def get_device_id_for_rank(local_rank: int) -> int:
    """The index of the device the rank with local rank ``local_rank`` (LOCAL_RANK, >= 0) uses, as ``iris.iris()``
    picks it: rank r on device r % devices (several simulated ranks per GPU wrap around); 0 on the CPU backend.

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
    """How many XCCs (accelerator complex dies) device ``device_id`` (default: the current one) has, >= 1: on AMD
    asked of ROCm 7 and later, else its architecture's count; 1 on NVIDIA GPUs and the CPU backend.

    Example:
        >>> config = iris.ccl.Config(num_xcds=iris.get_num_xcc())
    """
    return runtime.get_backend().xcc_count(device_id)
