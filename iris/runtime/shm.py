"""Named POSIX shared-memory segments that cannot outlive their job unnoticed.

The creator holds a shared ``flock`` while the name exists, so a rank killed before unlinking leaves a segment
nobody locks, which :func:`remove_stale_segments` deletes; a live job's segments are never touched.

Example:
    >>> segment = create_segment("/iris_demo_0_0", 1 << 20)
    >>> peer_view = open_segment("/iris_demo_0_0", 1 << 20)   # in another process
    >>> segment.unlink()                                       # every peer has mapped it
"""

from __future__ import annotations

import fcntl
import glob
import mmap
import os

import _posixshmem

SEGMENT_PREFIX = "iris_"
SHM_DIRECTORY = "/dev/shm"


def _human(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if nbytes < 1024 or unit == "TiB":
            return f"{nbytes:.4g} {unit}" if unit != "B" else f"{nbytes} B"
        nbytes /= 1024
    raise AssertionError("unreachable")


def memory_available() -> int | None:
    """The host's available memory in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def capacity_report() -> str:
    """What this machine offers shared memory: /dev/shm's size and free bytes, and the memory available."""
    parts = []
    try:
        fs = os.statvfs(SHM_DIRECTORY)
        parts.append(f"{SHM_DIRECTORY} holds {_human(fs.f_blocks * fs.f_frsize)} "
                     f"({_human(fs.f_bavail * fs.f_frsize)} free)")
    except OSError:
        parts.append(f"{SHM_DIRECTORY} is missing")
    available = memory_available()
    if available is not None:
        parts.append(f"{_human(available)} of memory available")
    return ", ".join(parts)


def backing_capacity() -> int | None:
    """Bytes of shared memory the machine can still back now: the free space of /dev/shm, at most the memory
    available (tmpfs pages are memory); None where neither can be read."""
    try:
        fs = os.statvfs(SHM_DIRECTORY)
        free = fs.f_bavail * fs.f_frsize
    except OSError:
        free = None
    available = memory_available()
    known = [n for n in (free, available) if n is not None]
    return min(known) if known else None


class Segment:
    """A segment this process created: mapped, and locked until :meth:`unlink` removes its name."""

    def __init__(self, name: str, fd: int, mapping: mmap.mmap):
        self.name, self._fd, self.mapping = name, fd, mapping

    def unlink(self) -> None:
        """Remove the name (the memory stays while anyone maps it) and let go of the lock."""
        if self._fd is None:
            return
        try:
            _posixshmem.shm_unlink(self.name)
        except FileNotFoundError:
            pass
        finally:
            os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self.unlink()
        self.mapping.close()

    def resident_bytes_reader(self):
        """A callable giving the bytes of memory the segment's touched pages take, valid after :meth:`unlink`
        (it holds a descriptor of its own), and a callable that closes that descriptor."""
        fd = os.dup(self._fd)
        return (lambda: os.fstat(fd).st_blocks * 512), (lambda: os.close(fd))


def create_segment(name: str, nbytes: int) -> Segment:
    """Create, size, lock and map segment ``name``; unlinks what it made if a later step fails. The segment is
    sparse: its pages take memory when first touched (tmpfs), so ``nbytes`` may exceed what /dev/shm holds
    (a heap reserves its whole range and backs what its allocations use: :func:`backing_capacity`).

    Raises:
        MemoryError: ``nbytes`` cannot be mapped here; the message says what the machine has.
        FileExistsError: the name is taken.
    """
    while True:
        fd = _posixshmem.shm_open(name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.fstat(fd).st_nlink:
            break
        os.close(fd)  # swept as stale between shm_open and flock: the name is free again
    try:
        os.ftruncate(fd, nbytes)
        return Segment(name, fd, mmap.mmap(fd, nbytes))
    except OSError as error:
        _posixshmem.shm_unlink(name)
        os.close(fd)
        raise MemoryError(f"{_human(nbytes)} of shared memory could not be mapped ({error.strerror}); "
                          f"{capacity_report()}") from error


def open_segment(name: str, nbytes: int) -> mmap.mmap:
    """Map a peer's segment ``name`` (made by :func:`create_segment` in another process)."""
    fd = _posixshmem.shm_open(name, os.O_RDWR, mode=0o600)
    try:
        return mmap.mmap(fd, nbytes)
    finally:
        os.close(fd)


def remove_stale_segments(pattern: str = "*") -> list[str]:
    """Delete the Iris segments (``/iris_<pattern>``) no live creator locks; returns their paths.

    Example:
        >>> remove_stale_segments()
        ['/dev/shm/iris_3fa2c1d0_8b1e07aa_1']
    """
    removed = []
    for path in sorted(glob.glob(os.path.join(SHM_DIRECTORY, f"{SEGMENT_PREFIX}{pattern}"))):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile, or another user's
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(path)  # while locked: its creator, if it just made it, sees nlink 0 and makes another
            removed.append(path)
        except OSError:  # locked by a live creator (BlockingIOError), or already removed
            pass
        finally:
            os.close(fd)
    return removed
