"""What every all_reduce variant module declares: a :class:`Variant`, its launch and its facts, which the front
door (:mod:`iris.ccl.all_reduce`) checks a call against: one place says what a variant does and where it runs.

Example:
    >>> ONE_SHOT = Variant("one_shot", launch, local_output=True)   # in iris.ccl.all_reduce.one_shot
    >>> ONE_SHOT.launch(ctx, out, x, ReduceOp.SUM, config, workspace, async_op=False)   # the bound launches
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class Variant:
    """``launch(ctx, output, input, op, config, workspace, async_op)`` launches the variant on the current stream
    and returns the bound launches. Facts: ``in_place`` (no member reads the input after it is overwritten),
    ``fused_only`` (one launch, barriers inside), ``local_output`` (writes only this member's output),
    ``barrier_free``, ``peers_read_input`` and ``engine_reads_input`` (the input must be on the heap; the
    latter where the heap may reach a rank by the engine), ``far_path_refusal`` (why refused for members on
    several nodes), ``check(input)`` (refuses a message before any launch)."""

    name: str
    launch: Callable
    in_place: bool = False
    fused_only: bool = False
    local_output: bool = False
    barrier_free: bool = False
    peers_read_input: bool = True
    engine_reads_input: bool = False
    far_path_refusal: str | None = None
    check: Callable | None = None

    def input_on_heap(self, engine: bool) -> bool:
        return self.peers_read_input or (engine and self.engine_reads_input)


@dataclasses.dataclass(eq=False)  # a call's key holds it by identity
class AllReduceWorkspace:
    """What all_reduce_preamble resolves once: the variant (name, :class:`Variant`), the group, its members,
    whether they span nodes, hierarchical's (node team, cross team). No memory: state lives in regions."""

    variant: str
    group: Any
    members: Any
    teams: tuple | None = None
    across_nodes: bool = False
    spec: Variant | None = None
