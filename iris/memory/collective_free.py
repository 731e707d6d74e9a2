"""Memory whose free is collective: kept until every rank can free it in the same call.

Why: NVSHMEM's and rocSHMEM's free is a barrier. Left to the garbage collector, ranks free at different
moments (or at exit on some ranks only) and the rank that frees waits forever. So allocations are freed
only inside :meth:`CollectiveFrees.free_unused`, the same ones in the same order on every rank; what is left
at exit is never freed by Python.

Example:
    >>> frees = CollectiveFrees()
    >>> entry = frees.keep(torch.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    >>> view = entry.view()          # what the heap hands out; the kept tensor stays ours
    >>> entry.released = True        # the context closed
    >>> del view
    >>> frees.free_unused(comm)      # collective: freed here on every rank at once
"""

from __future__ import annotations

import atexit
import ctypes
from dataclasses import dataclass

import torch


def _storage_users(tensor: torch.Tensor) -> int | None:
    """How many tensors (and storage objects) share ``tensor``'s storage; None where torch cannot say."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    if count is None:
        return None
    return int(count(tensor.untyped_storage()._cdata))


def never_free(obj) -> None:
    """Keep ``obj`` alive forever, for collectively freed memory no collective free can pair up.

    Example:
        >>> never_free(symm_mem.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


@dataclass(eq=False)
class Kept:
    """One allocation held for a collective free, with what must live as long (``companions``)."""

    tensor: torch.Tensor
    companions: tuple = ()
    released: bool = False

    def view(self) -> torch.Tensor:
        """A tensor over the same memory to hand out; the kept one stays private."""
        return self.tensor[:]

    def unused(self, alone: int | None) -> bool:
        """Released, and viewed by no tensor but the kept one (``alone``: a lone tensor's use count)."""
        users = _storage_users(self.tensor)
        return self.released and alone is not None and users is not None and users <= alone


class CollectiveFrees:
    """The allocations of this process whose free is collective (see the module)."""

    def __init__(self):
        self.entries: list[Kept] = []
        self._alone = _storage_users(torch.empty(1))  # a tensor that nothing else views
        self._kept_at_exit = False
        atexit.register(self.keep_at_exit)

    def keep(self, tensor: torch.Tensor, *companions) -> Kept:
        """Hold ``tensor`` (and ``companions``) until a collective free; call on every rank in the same order."""
        entry = Kept(tensor, companions)
        self.entries.append(entry)
        return entry

    def abandon(self, tensor: torch.Tensor) -> None:
        """Never free ``tensor`` (only some ranks made it)."""
        never_free(tensor)

    def free_unused(self, comm) -> int:
        """Collective: free, on every rank in the same order, the allocations unused on every rank.

        Returns:
            how many were freed.
        """
        unused = [i for i, entry in enumerate(self.entries) if entry.unused(self._alone)]
        agreed = set(unused).intersection(*map(set, comm.all_gather_object(unused)))
        if not agreed:
            return 0
        freed = [entry for i, entry in enumerate(self.entries) if i in agreed]
        self.entries = [entry for i, entry in enumerate(self.entries) if i not in agreed]
        for entry in freed:  # in the order made: the engine's frees pair up rank by rank
            entry.companions = ()
            entry.tensor = None
        return len(freed)

    def keep_at_exit(self) -> None:
        """At exit, never free what is held, so no rank waits on peers that have gone."""
        if self._kept_at_exit:
            return
        self._kept_at_exit = True
        never_free(self.entries)
