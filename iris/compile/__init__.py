"""``torch.compile`` support: Iris's collectives and fused ops as ``torch.ops.iris.<name>`` custom ops, registered
on import and run on the context given to :func:`set_context` (the ops: :mod:`iris.compile.functional`).

Example:
    >>> iris.compile.set_context(ctx)
    >>> f = torch.compile(lambda x: torch.ops.iris.all_reduce(x) * 2, fullgraph=True)
"""

from iris.compile.functional import OPS, get_context, set_context

__all__ = ["OPS", "get_context", "set_context"]
