"""Named memory orderings and scopes for the device ops' ``sem`` and ``scope``.

Each member *is* the string the ops take (``Semantic.ACQUIRE == "acquire"``), so the spellings mix. Pass a
member in as a ``tl.constexpr``: read inside a kernel's body it does not compile with Triton 3.6.

Example:
    >>> @triton.jit
    ... def kernel(flag, heap_bases, peer, SEM: tl.constexpr):
    ...     rank = iris.current_rank(heap_bases)
    ...     iris.atomic_add(flag, 1, rank, peer, heap_bases, sem=SEM, scope="sys")
    >>> kernel[(1,)](flag, ctx.get_heap_bases(), 1, iris.Semantic.RELEASE)
"""

import enum


class _Word(str, enum.Enum):
    """A str enum whose ``str()`` and f-string are the word itself, on every Python version."""

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Semantic(_Word):
    """An atomic's memory ordering (its ``sem``).

    Example:
        >>> iris.atomic_cas(lock, 0, 1, rank, peer, heap_bases, sem=iris.Semantic.ACQUIRE, scope=iris.Scope.SYS)
    """

    RELAXED = "relaxed"
    ACQUIRE = "acquire"
    RELEASE = "release"
    ACQ_REL = "acq_rel"


class Scope(_Word):
    """Which threads an atomic's ordering covers (its ``scope``); a flag another GPU observes needs ``SYS``.

    Example:
        >>> iris.signal(flag, 1, rank, peer, heap_bases, scope=iris.Scope.SYS)
    """

    CTA = "cta"
    WORKGROUP = "cta"
    GPU = "gpu"
    DEVICE = "gpu"
    AGENT = "gpu"
    SYS = "sys"
    SYSTEM = "sys"
