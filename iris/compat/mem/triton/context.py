"""``Context``: the original's newest name of :class:`iris.DeviceContext` (``iris.mem.triton.context``).

Example:
    >>> from iris.mem.triton.context import Context
    >>> @triton.jit
    ... def kernel(context, buf, rank: tl.constexpr, world_size: tl.constexpr):
    ...     ctx = Context.initialize(context, rank, world_size)
    ...     ctx.store(buf + tl.arange(0, 16), 1, to_rank=(rank + 1) % world_size)
"""

from iris.device.context import DeviceContext
from iris.device.tracing import DeviceTracing

Context = DeviceContext
Tracing = DeviceTracing

__all__ = ["Context", "DeviceContext", "DeviceTracing", "Tracing"]
