"""Which all_reduce variant runs a call that names none: by the members' nodes, then by size from the tuned
table; the front door and hierarchical's steps (which compose the flat variants, :data:`FLAT`) choose alike.

Example:
    >>> choose_variant(1024, in_place=False, world_size=8, dtype=torch.bfloat16)
    'one_shot'
"""

from __future__ import annotations

import torch

from iris.ccl import hierarchy
from iris.ccl.all_reduce import tuned
from iris.ccl.all_reduce.atomic import ATOMIC
from iris.ccl.all_reduce.one_shot import ONE_SHOT
from iris.ccl.all_reduce.push import LL, PUSH, holds
from iris.ccl.all_reduce.ring import RING
from iris.ccl.all_reduce.spinlock import SPINLOCK
from iris.ccl.all_reduce.two_shot import TWO_SHOT

FLAT = {variant.name: variant for variant in (ONE_SHOT, TWO_SHOT, ATOMIC, SPINLOCK, RING, PUSH, LL)}
# The dtype names of benchmarks/ccl.py, which keys the tuned table by them.
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "int32"}
ELEMENT_SIZES = {name: dtype.itemsize for dtype, name in DTYPE_NAMES.items()}


def choose_variant(nbytes: int, in_place: bool, world_size: int, dtype=torch.bfloat16) -> str:
    """The default variant for ``nbytes`` per rank of ``dtype`` among ``world_size`` members on one node: the
    entry of the tuned table (:mod:`iris.ccl.all_reduce.tuned`; an untuned dtype takes a tuned one's), the next
    entry past a push or ll entry's landing zones, two_shot where the entry cannot run in place, past the
    entries and at untuned world sizes (its traffic per member stays under twice the data)."""
    name = DTYPE_NAMES.get(dtype, dtype)
    table = tuned.ALL_REDUCE.get((world_size, name))
    if table is None:  # not tuned for this dtype: the first tuned dtype's table at this world size
        table = next((entries for (world, _), entries in tuned.ALL_REDUCE.items() if world == world_size), ())
    element_size = ELEMENT_SIZES.get(name, 1)
    variant = next((variant for below, variant in table
                    if nbytes < below and holds(variant, nbytes // element_size, element_size)), "two_shot")
    return variant if FLAT[variant].in_place or not in_place else "two_shot"


def default_variant(nodes: tuple[int, ...], input, in_place: bool, world_size: int) -> str:
    """The variant of a call that names none among ``world_size`` members on ``nodes``: hierarchical where it
    pays (:func:`iris.ccl.hierarchy.pays`); across nodes ll where it holds the message (each remote access is a
    transport call, and ll makes one exchange of words); else :func:`choose_variant`."""
    if hierarchy.pays(nodes):
        return "hierarchical"
    if len(set(nodes)) > 1 and holds("ll", input.numel(), input.element_size()):
        return "ll"
    return choose_variant(input.nbytes, in_place, world_size, input.dtype)
