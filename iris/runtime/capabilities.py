"""What a backend cannot honour, in one table, each gap with its reason.

Code asks :func:`limitation` instead of special-casing a backend, so a gap is marked with its reason, never
skipped silently. Each row has a test that fails once the gap disappears, so stale rows get deleted.

Example:
    >>> from iris.runtime.capabilities import limitation
    >>> limitation("cpu", "atomic", "bfloat16")
    "Triton's interpreter has no bfloat16 atomics (numpy has no bfloat16 type)"
    >>> limitation("cuda", "atomic", "bfloat16") is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limitation:
    """One gap: ``backend`` cannot honour ``feature`` for ``dtype`` (None: any dtype), because ``reason``.

    ``concurrent_only``: the gap shows only with several writers on one word at once.
    """

    backend: str
    feature: str
    dtype: str | None
    reason: str
    concurrent_only: bool = False


LIMITATIONS: tuple[Limitation, ...] = (
    Limitation("cpu", "atomic", "bfloat16",
               "Triton's interpreter has no bfloat16 atomics (numpy has no bfloat16 type)"),
    Limitation("cpu", "atomic", "float16",
               "Triton's interpreter emulates float16 atomics with a read-modify-write that is not atomic "
               "across processes; a single writer is exact, concurrent writers can lose updates",
               concurrent_only=True),
    Limitation("cpu", "cuda_graph", None,
               "CUDA graphs record work queued on a GPU; the CPU backend runs each kernel on the host at once, "
               "so there is nothing to capture or replay"),
    Limitation("cpu", "inline_asm", None,
               "Triton's interpreter cannot run inline assembly (PTX or AMDGCN); device code takes a host path "
               "where iris.runtime.device_facts() has none (the debug clock), and the cross-compile gate still "
               "compiles the assembly for each GPU target"),
    Limitation("cpu", "concurrent_programs", None,
               "Triton's interpreter runs the programs of a launch one after another, in program-id order: "
               "a race between programs of one launch never shows, and a program that waits on a program "
               "with a higher id hangs (on a GPU it may too: programs need not be resident together)"),
    Limitation("cpu", "shmem_heap", None,
               "NVSHMEM and rocSHMEM, the engines behind the shmem heap, run on GPUs only; the CPU backend's "
               "heaps are POSIX shared memory, reached inside one machine"),
)


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    return str(dtype).removeprefix("torch.")


def find_limitation(backend: str, feature: str, dtype=None, concurrent: bool = False) -> Limitation | None:
    """The table's row saying ``backend`` cannot honour ``feature`` (for ``dtype``), or None when it can.

    Args:
        backend: "cpu", "cuda" or "hip".
        feature: what is asked for, e.g. "atomic".
        dtype: a torch dtype or its name ("float16"), or None.
        concurrent: the case has several writers on one word at once.

    Returns:
        The matching :class:`Limitation`, or None.
    """
    name = _dtype_name(dtype)
    for row in LIMITATIONS:
        if row.backend != backend or row.feature != feature:
            continue
        if row.dtype is not None and row.dtype != name:
            continue
        if row.concurrent_only and not concurrent:
            continue
        return row
    return None


def limitation(backend: str, feature: str, dtype=None, concurrent: bool = False) -> str | None:
    """The reason ``backend`` cannot honour ``feature`` (for ``dtype``) as a sentence, or None when it can."""
    row = find_limitation(backend, feature, dtype, concurrent)
    return row.reason if row else None
