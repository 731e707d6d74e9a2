"""The original's newest device-API package path: ``iris.mem.triton`` holds :class:`iris.DeviceContext`
(its newest name: ``Context``) and the functional device ops, the same objects as ``iris.*``.

Example:
    >>> from iris.mem.triton.context import Context   # iris.DeviceContext
"""

from iris.compat.mem import triton

__all__ = ["triton"]
