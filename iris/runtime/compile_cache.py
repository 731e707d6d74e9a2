"""Triton's file cache, where the ranks that need the same kernel at once compile it once.

Why: with Triton's own cache every rank that misses compiles the same kernel side by side. Here the first
holds a lock while it compiles and the others load its result; after ``WAIT_S`` a waiter compiles itself, so
a dead rank cannot hang the others.
"""

from __future__ import annotations

import fcntl
import os
import time

from triton import knobs
from triton.runtime.cache import FileCacheManager

WAIT_S = 180.0


class CompileOnceCacheManager(FileCacheManager):
    """A :class:`FileCacheManager` that compiles a kernel in one process while the others wait."""

    _lock = None

    def get_group(self, filename: str):
        group = super().get_group(filename)
        if group is not None or not self.cache_dir:
            return group
        os.makedirs(self.cache_dir, exist_ok=True)
        lock = open(os.path.join(self.cache_dir, "iris-compiling.lock"), "w")  # noqa: SIM115  (held across calls)
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:  # compile without the lock rather than hang
                    lock.close()
                    return super().get_group(filename)
                time.sleep(0.05)
        group = super().get_group(filename)  # another process may have compiled it meanwhile
        if group is not None:
            lock.close()
        else:
            self._lock = lock  # held while this process compiles; put_group (or this object's end) lets go
        return group

    def put_group(self, filename: str, group):
        try:
            return super().put_group(filename, group)
        finally:
            if self._lock is not None:
                self._lock.close()
                self._lock = None


def install() -> None:
    """Use :class:`CompileOnceCacheManager` for Triton's cache, unless another manager was chosen."""
    if knobs.cache.manager_class is None:
        knobs.cache.manager_class = CompileOnceCacheManager
