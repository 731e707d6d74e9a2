"""Triton device API under the original's newest path (``iris.mem.triton``): the same objects as ``iris.*``.

Example:
    >>> from iris.mem.triton import Context, load, store
    >>> Context is iris.DeviceContext
    True
"""

from iris.compat.mem.triton import context, ops

__all__ = context.__all__ + ops.__all__
globals().update({name: getattr(context, name) for name in context.__all__})
globals().update({name: getattr(ops, name) for name in ops.__all__})
