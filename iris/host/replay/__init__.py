"""Replaying a repeated call: a kernel launch bound once (:func:`bind`, :class:`Relaunch`) and a ``ctx.ccl``/
``ctx.ops`` call's launches remembered and relaunched through one helper, :meth:`Plans.call` (:mod:`.plans`; its C
fast path: :mod:`.native`). Example: ``bind(my_kernel, (4,), x, y, n, BLOCK=256)()``.
"""

from iris.host.replay.plans import (BoundLaunch, Plans, bind, call_key, captured_graph, graph_launcher, rank_specific,
                                    unchecked, value_key, weakly_held)
from iris.host.replay.relaunch import Relaunch

__all__ = ["BoundLaunch", "Plans", "Relaunch", "bind", "call_key", "captured_graph", "graph_launcher", "rank_specific",
           "unchecked", "value_key", "weakly_held"]
