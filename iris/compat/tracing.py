"""``iris.tracing``, the original's module path: the host side of tracing, :mod:`iris.host.tracing`.

Example:
    >>> from iris.tracing import Tracing, summarize
"""

from iris.host.tracing import Tracing, summarize

__all__ = ["Tracing", "summarize"]
