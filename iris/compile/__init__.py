"""``torch.compile`` support: Iris's collectives and fused ops as ``torch.ops.iris.<name>`` custom ops.

Importing this module registers the ops; :func:`set_context` names the context they run on (the original
Iris's surface). The ops and their shapes are listed in :mod:`iris.compile.functional`.

Example:
    >>> import iris, torch
    >>> ctx = iris.iris(1 << 30)
    >>> iris.compile.set_context(ctx)
    >>> f = torch.compile(lambda x: torch.ops.iris.all_reduce(x) * 2, fullgraph=True)
    >>> y = f(torch.ones(1024, device=ctx.get_device()))
"""

from iris.compile.functional import OPS, get_context, set_context

__all__ = ["OPS", "get_context", "set_context"]
