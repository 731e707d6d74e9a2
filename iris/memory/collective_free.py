"""Memory whose free is collective: kept until every rank can free it in the same call.

NVSHMEM's and rocSHMEM's free waits for every rank (``nvshmem_free`` includes a barrier). Left to
the garbage collector, a shmem heap is freed when the last tensor viewing it dies: at different
moments on different ranks, and at exit on some ranks only (objects in reference cycles, a rank that
ends first), so the rank that frees waits forever for the others.

:class:`CollectiveFrees` holds every such allocation of the process, in the order made (the same
on every rank, since making one is collective). An allocation is freed only inside a collective
call (:meth:`CollectiveFrees.free_unused`), where every rank frees the same allocations in the same
order: those that are released (their context closed) and that no tensor views any more, on every
rank. At exit, whatever is left is never freed by Python (the process's end returns it to the
driver), so no rank waits at exit for a peer that has already gone.

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
    """Take a reference to ``obj`` that is never dropped: Python never frees it, not even at exit (the
    process's end returns its memory). For memory whose free is collective where no collective free
    can pair up (an allocation some ranks made, what is left at exit).

    Example:
        >>> never_free(symm_mem.empty(1 << 20, dtype=torch.uint8, device="cuda"))
    """
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


@dataclass(eq=False)
class Kept:
    """One allocation held for a collective free: ``tensor`` (never handed out), what else must live as
    long (``companions``, e.g. the engine's rendezvous handle), and whether its owner let it go."""

    tensor: torch.Tensor
    companions: tuple = ()
    released: bool = False

    def view(self) -> torch.Tensor:
        """A tensor over the same memory to hand out (the kept tensor itself stays private)."""
        return self.tensor[:]

    def unused(self, alone: int | None) -> bool:
        """Released, and no tensor but the kept one views the memory (``alone``: the count of a tensor
        alone, measured on this torch)."""
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
        """Never free ``tensor`` (an allocation only some ranks made: no free of it can pair up)."""
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
        """At exit, before the interpreter's teardown: what is still held is never freed by Python (a
        reference that is never dropped), so no rank frees, and waits, after its peers have gone."""
        if self._kept_at_exit:
            return
        self._kept_at_exit = True
        never_free(self.entries)
