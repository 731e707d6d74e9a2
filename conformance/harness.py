"""The driver side and the rank side of a conformance property.

Driver (the pytest process): hypothesis draws a case, :meth:`World.check`
sends it to every rank of one persistent :class:`~iris.testing.RankPool`, and
each rank returns a list of the violations it saw (empty when the property
held). Ranks report violations instead of raising, so every rank reaches the
same collectives and the pool stays healthy while hypothesis shrinks.

Rank side: :func:`context` is one Iris context per rank process for the whole
session, and :func:`arena` is its entire heap as bytes. A case carves its
buffers out of the arena at the offsets it drew, so no case allocates and the
heaps stay symmetric whatever an earlier case did.

Example (a property file):
    >>> def _on_rank(case):                      # runs on every rank
    ...     ctx = harness.context()
    ...     return [] if ok else [f"element 3 is {x}, expected {y}"]
    >>> @given(case=cases())
    ... def test_something(world, case):
    ...     world.check(_on_rank, case)
"""

from __future__ import annotations

import inspect
import os
import shlex

import torch

import iris  # noqa: F401  (before triton: picks the backend and, on the CPU, Triton's interpreter)
import triton  # noqa: I001
from hypothesis import strategies as st

from conformance.dtypes import element_size
from iris.testing import RankFailure, RankPool

HEAP_BYTES = 1 << 20  # per rank: big enough for every case, small enough to compare whole on every case
CALL_TIMEOUT = float(os.environ.get("IRIS_TEST_TIMEOUT", "180"))  # a case that hangs fails after this

# ------------------------------------------------------------------------------------------- driver


class CaseHung(BaseException):
    """A case that hung: every rank still running at the time limit, none failed before it.

    A BaseException, not an AssertionError, so that hypothesis ends the property at once instead of
    shrinking it: shrinking runs smaller cases, and for a hang each would wait out the whole limit and
    restart the pool (ten minutes or more before any report). pytest reports it as the test's failure,
    with the case, each rank's stack and the reproduce line.
    """


class World:
    """The ranks of the session, and how a failing case is reported.

    Args:
        pool: the session's RankPool.
        profile: the hypothesis profile in use (for the reproduce line).
    """

    def __init__(self, pool: RankPool, profile: str):
        self.pool = pool
        self.profile = profile
        self.nodeid = ""  # set per test by the fixture

    @property
    def size(self) -> int:
        return self.pool.world_size

    def reproduce_line(self) -> str:
        env = " ".join(f"{k}={shlex.quote(os.environ[k])}" for k in ("IRIS_BACKEND", "IRIS_SIMULATION")
                       if k in os.environ)
        return (f"{env + ' ' if env else ''}python -m pytest {shlex.quote(self.nodeid)} --ranks {self.size} "
                f"--hypothesis-profile {self.profile}")

    def check(self, fn, case, timeout: float | None = None) -> list:
        """Run ``fn(case)`` on every rank; fail with every rank's violations, the case and a reproduce line.

        Returns:
            Each rank's result (a list of violations, empty, or what ``fn`` returned after them).

        Raises:
            AssertionError: a rank reported a violation, raised or crashed.
            CaseHung: no rank answered within the time limit (not shrunk: see :class:`CaseHung`).
        """
        try:
            results = self.pool.run(fn, case, timeout=CALL_TIMEOUT if timeout is None else timeout)
        except RankFailure as exc:
            report = f"{exc}\ncase: {case!r}\nreproduce: {self.reproduce_line()}"
            if exc.hung:
                raise CaseHung(report) from None
            raise AssertionError(report) from None
        violations = {rank: result.violations for rank, result in enumerate(results) if result.violations}
        if violations:
            lines = [f"rank {rank}: {text}" for rank, texts in sorted(violations.items()) for text in texts[:8]]
            raise AssertionError(f"{fn.__name__} violated on rank(s) {sorted(violations)} of {self.size}:\n"
                                 + "\n".join(lines) + f"\ncase: {case!r}\nreproduce: {self.reproduce_line()}")
        return [result.value for result in results]


class Verdict:
    """What a rank sends back: the violations it saw, and optionally a value for the driver to check."""

    def __init__(self, violations: list[str] | None = None, value=None):
        self.violations = list(violations or [])
        self.value = value


def offsets(span: int, align: int):
    """Byte offsets, multiples of ``align``, where ``span`` bytes fit in the arena (anywhere, up to its end)."""
    return st.integers(0, (HEAP_BYTES - span) // align).map(lambda i: i * align)


def seeds():
    """Seeds for :func:`generator`: each case's data."""
    return st.integers(0, 2**31 - 1)


# ------------------------------------------------------------------------------------------- rank side

_context = None
_arena = None


def context():
    """This rank's Iris context for the session (created on first use, collectively)."""
    global _context, _arena
    if _context is None:
        import iris

        # --heap-size: a larger heap (the original's 64 GiB); the cases use its first HEAP_BYTES
        _context = iris.iris(max(HEAP_BYTES, int(os.environ.get("IRIS_CONFORMANCE_HEAP_SIZE", "0"))))
        _arena = _context.empty(HEAP_BYTES, dtype=torch.uint8)
    return _context


def arena() -> torch.Tensor:
    """The whole heap of this rank as a uint8 tensor (offset 0 is the heap base)."""
    context()
    return _arena


def shares_device(a: int, b: int) -> bool:
    """Ranks ``a`` and ``b`` run on one GPU (simulation), where kernels of different ranks take turns
    in time slices of about a millisecond instead of running side by side. False on the CPU backend."""
    ctx = context()
    return ctx.get_device().type != "cpu" and ctx.backend.device_for(a) == ctx.backend.device_for(b)


_groups: dict = {}


def group(members: tuple[int, ...]):
    """The torch.distributed group of ``members`` (None for every rank), made once per session.

    Collective: every rank must ask for the same groups in the same order (every rank runs the
    same cases, so a property that asks on every rank is fine). Default backends: see
    ``Iris.device_barrier`` for why not ``backend="gloo"``.
    """
    if len(members) == context().get_num_ranks():
        return None
    if members not in _groups:
        import torch.distributed as dist

        _groups[members] = dist.new_group(list(members))
    return _groups[members]


def region(offset: int, count: int, dtype: torch.dtype) -> torch.Tensor:
    """``count`` elements of ``dtype`` at byte ``offset`` of the arena (offset a multiple of the element size)."""
    return arena()[offset : offset + count * element_size(dtype)].view(dtype)


def generator(seed: int, rank: int, stream: int = 0) -> torch.Generator:
    """A CPU generator every rank can recreate for any rank: how each rank knows its peers' data."""
    return torch.Generator().manual_seed((seed * 1_000_003 + rank * 7919 + stream) % (1 << 63))


def background(seed: int, rank: int) -> torch.Tensor:
    """The random bytes that fill rank ``rank``'s arena before a case (CPU tensor)."""
    return torch.randint(0, 256, (HEAP_BYTES,), dtype=torch.uint8, generator=generator(seed, rank, 1))


def fill_arena(seed: int) -> torch.Tensor:
    """Fill this rank's arena with its background bytes; return a CPU copy to build the expectation on."""
    ctx = context()
    expected = background(seed, ctx.get_rank())
    arena().copy_(expected)
    return expected


def compare_arena(expected: torch.Tensor, what: str = "heap") -> list[str]:
    """Byte-exact comparison of the whole arena with ``expected``; violations name the first bad offsets."""
    actual = arena().cpu()
    bad = (actual != expected).nonzero().flatten()
    if bad.numel() == 0:
        return []
    first = ", ".join(f"{int(o)}: {int(actual[o])} (expected {int(expected[o])})" for o in bad[:6])
    return [f"{bad.numel()} wrong byte(s) in the {what}, first at offsets {first}"]


def attempt(launch, *args, **kwargs) -> list[str]:
    """Call ``launch``; an exception becomes a violation, so this rank still reaches the next collective.

    A rank that raised between two barriers would leave its peers waiting in the second one.
    """
    try:
        launch(*args, **kwargs)
    except Exception as exc:  # reported to the driver with the case, not raised here
        text = str(exc).strip().splitlines()
        said = " ... ".join(dict.fromkeys([text[0], text[-1]])) if text else ""  # what failed ... why
        return [f"launch raised {type(exc).__name__}: {said}"]
    return []


def jit(fn=None, *, aligned: tuple[str, ...] = ()):
    """``triton.jit`` that compiles a kernel once per set of constexprs and dtypes, not once per case.

    Triton specializes every integer argument on being 1 or a multiple of 16, and every pointer
    on 16-byte alignment, so random ranks, sizes and offsets would each compile a new variant
    (seconds each on a GPU). Every argument that is not a constexpr is kept generic, except
    the pointers named in ``aligned``, whose alignment the property means to vary.

    Example:
        >>> @harness.jit(aligned=("src",))
        ... def _kernel(src, n, BLOCK: tl.constexpr): ...
    """
    def wrap(kernel):
        runtime = [name for name, param in inspect.signature(kernel).parameters.items()
                   if "constexpr" not in str(param.annotation) and name not in aligned]
        return triton.jit(kernel, do_not_specialize=runtime, do_not_specialize_on_alignment=runtime)

    return wrap(fn) if fn is not None else wrap


def marks_for(feature: str, dtype=None, concurrent: bool = False) -> list:
    """pytest marks for a case the backend cannot run at all: a skip with the capability table's reason."""
    import pytest

    from iris.runtime.capabilities import find_limitation
    from iris.runtime import SELECTED

    row = find_limitation(SELECTED or "", feature, dtype, concurrent=concurrent)
    return [pytest.mark.skip(reason=f"{SELECTED} backend: {row.reason}")] if row else []


def to_device(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` on ``device``, moved as bytes (torch's CUDA kernels lack some dtypes, uint32 among them)."""
    return byte_view(tensor).to(device).view(tensor.dtype).view(tensor.shape)


def device_poison(count: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``count`` elements of ``dtype`` on ``device`` whose bytes are all 0xA5 (made without dtype kernels)."""
    return torch.full((count * element_size(dtype),), 0xA5, dtype=torch.uint8, device=device).view(dtype)


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.contiguous().view(torch.uint8)
