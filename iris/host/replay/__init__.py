"""Replaying a repeated call: a kernel launch bound once, a ccl/ops call's launches remembered and relaunched.

- :mod:`iris.host.replay.plans`: :func:`bind` (a Triton launch for the price of the driver call),
  :class:`Plans` (a context's remembered calls, by :func:`call_key`), CUDA-graph capture and launch;
- :mod:`iris.host.replay.native` and ``native.c``: the host path of a repeated call in one C call (CUDA);
- :mod:`iris.host.replay.relaunch`: :class:`Relaunch`, a kernel launched with new arguments on every call, without
  Triton's per-call Python.

Example:
    >>> launch = bind(my_kernel, (4,), x, y, n, BLOCK=256)
    >>> launch()   # my_kernel[(4,)](x, y, n, BLOCK=256), without Triton's per-call Python
"""

from iris.host.replay.plans import (BoundLaunch, Plans, bind, call_key, captured_graph, graph_launcher, value_key,
                               weakly_held)
from iris.host.replay.relaunch import Relaunch

__all__ = ["BoundLaunch", "Plans", "Relaunch", "bind", "call_key", "captured_graph", "graph_launcher", "value_key",
           "weakly_held"]
