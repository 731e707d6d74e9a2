"""The stall watchdog (IRIS_STALL_TIMEOUT): a rank whose device wait gives up ends, naming the wait and its call.

Why: without it a rank that stops calling collectives (a stall, a hang elsewhere, an early exit under a launcher
that does not notice) leaves every peer spinning for ever, silently. Every device wait of the process is compiled
bounded by ``IRIS_STALL_TIMEOUT`` seconds (600 unless set; 0: unbounded, no watchdog), as debug mode's are,
without its access checks; one that gives up fills in the debug record and returns. In a process with debug
checks, debug mode raises what it reports after a call; the watchdog leaves an access report to it, and a wait's
report for one poll. A thread of each rank reads the record once a second (on a stream of
its own, so a kernel still spinning on the device does not block it) and, on a report, prints what the rank
waited for (the word, its owner, the value expected and the last seen; for a device barrier, the peer that never
arrived) and the rank's last Iris call, then ends the process with :data:`EXIT_CODE`; ``iris run`` (or any
launcher watching exit codes) then ends the job. The bound is generous by design: a wait legitimately lasts as
long as the slowest peer takes to reach the same call.

Example:
    $ IRIS_STALL_TIMEOUT=300 iris run -n 2 train.py
    [iris] rank 0 stalled: rank 0 program 0 gave up after 300.0 s in device_barrier: waiting for rank 1 to arrive
    (...); its last Iris call: all_reduce (call 1842 of this rank). Ending this rank (exit code 75).
"""

from __future__ import annotations

import os
import struct
import sys
import threading
import time

import torch

from iris import config
from iris.device import sync
from iris.host import debug
from iris.runtime import shm

EXIT_CODE = 75  # EX_TEMPFAIL: not the program's own failure
_STALLS = (sync.WAIT_UNTIL_RECORD.value, sync.DEVICE_BARRIER_RECORD.value)  # the record's kinds that end a rank
POLL_S = 1.0
_PROGRESS = struct.Struct("<qd48s")  # a rank's board: calls so far, when it was last told one, the call's name

_watchdog: StallWatchdog | None = None


class StallWatchdog(threading.Thread):
    """The thread of one process: polls the debug record and ends the process on a wait that gave up."""

    def __init__(self, ctx, timeout_s: float):
        super().__init__(name="iris stall watchdog", daemon=True)
        self._rank, self._world = ctx.cur_rank, ctx.num_ranks
        self.heap = ctx.heap
        self.last_call = ("", 0)  # (name, calls so far): set by iris.host.replay's Plans on every call
        self.stopped = threading.Event()
        # the node's progress boards (under a launcher that names the job): each rank's last call, for the report
        self._job = config.job_id()
        self._board, self._boards = None, {}
        if self._job:
            self._board = shm.create_segment(_board_name(self._job, self._rank), _PROGRESS.size)
            self._boards = _node_boards(ctx.comm, self._job, self._world, self._board, timeout_s)
        self._posted = None

    def note_call(self, name: str) -> None:
        self.last_call = (name, self.last_call[1] + 1)

    def _post(self) -> None:
        """This rank's last call on its board (once a second: the hot path only counts)."""
        board = self._board
        if board is not None and self.last_call != self._posted:
            self._posted = name, calls = self.last_call
            try:
                _PROGRESS.pack_into(board.mapping, 0, calls, time.time(), name.encode()[:48])
            except ValueError:  # closed meanwhile (the context closed)
                pass

    def _peers(self) -> str:
        """Each rank's last Iris call as its board on this node says (ranks of other nodes unseen)."""
        parts = []
        for rank in range(self._world):
            mapping = self._boards.get(rank)
            if mapping is None:
                parts.append(f"rank {rank} unseen (another node)")
                continue
            try:
                calls, when, name = _PROGRESS.unpack_from(mapping, 0)
            except ValueError:  # closed meanwhile (the context closed)
                continue
            name = name.rstrip(b"\0").decode() or "none"
            parts.append(f"rank {rank} {name} (call {calls}, {time.time() - when:.0f} s ago)" if calls else
                         f"rank {rank} no call yet")
        return "; ".join(parts)

    def close(self) -> None:
        self.stopped.set()
        boards, self._boards = self._boards, {}
        for mapping in boards.values():
            mapping.close()
        if self._board is not None:
            self._board.close()
            self._board = None

    def _record_words(self) -> list[int]:
        record = debug._record
        if record.is_cpu:  # memory the host reads directly (the CPU backend, IRIS_RECORD_ON_HOST)
            return record[:7].tolist()
        side = getattr(self, "_side", None) or torch.cuda.Stream(device=record.device)
        self._side = side
        with torch.cuda.stream(side):  # not queued behind a kernel that still spins on the compute stream
            words = record[:7].to("cpu", non_blocking=True)
        side.synchronize()
        return words.tolist()

    def run(self) -> None:
        held = None  # a wait's report debug mode had a poll to raise and did not
        while not self.stopped.wait(POLL_S):
            self._post()
            words = self._record_words()
            if words[0] not in _STALLS:  # nothing, or an access debug mode checked: its to raise after the call
                held = None
                continue
            if debug.compiled_in() and words != held:  # debug mode raises a wait that gave up at its next check
                held = words
                continue
            report = debug.take_report(self._rank, self.heap, words)
            name, calls = self.last_call
            during = f"its last Iris call: {name} (call {calls} of this rank)" if name else "no Iris call made yet"
            peers = f" Last calls by rank: {self._peers()} (a rank behind the others is the one missing)." \
                if self._job else ""
            print(f"[iris] rank {self._rank} stalled: {report}; {during}.{peers} Ending this rank (exit code "
                  f"{EXIT_CODE}; IRIS_STALL_TIMEOUT sets the bound).", file=sys.stderr, flush=True)
            os._exit(EXIT_CODE)


def _board_name(job: str, rank: int) -> str:
    return f"/{shm.SEGMENT_PREFIX}{job}_progress_{rank}"


def _node_boards(comm, job: str, world: int, own, timeout_s: float) -> dict:
    """rank -> its progress board, for every rank of this node (``own``, this rank's, just made), mapped while
    the names exist: every rank makes its board before the first meeting and removes its name after the second,
    so a job that ends without closing (its launcher killed) leaves no name behind in /dev/shm."""
    what = "the stall watchdog's progress boards (every rank makes a context)"
    comm.meet(timeout_s, what)
    boards = {}
    for rank in range(world):
        try:
            boards[rank] = shm.open_segment(_board_name(job, rank), _PROGRESS.size)
        except OSError:  # a rank of another node
            pass
    comm.meet(timeout_s, what)
    own.unlink()  # its memory stays mapped by the node's ranks
    return boards


def watch(ctx, timeout_s: float) -> StallWatchdog:
    """Bound this process's device waits by ``timeout_s`` and start its watchdog (once per process; a later
    context replaces the watched one)."""
    global _watchdog
    debug.bound_waits(ctx._device, timeout_s)
    if _watchdog is not None:
        _watchdog.close()
    _watchdog = StallWatchdog(ctx, timeout_s)
    _watchdog.start()
    return _watchdog


def stop(heap) -> None:
    """Stop the watchdog where it watches the context of ``heap`` (that context closed)."""
    global _watchdog
    if _watchdog is not None and _watchdog.heap is heap:
        _watchdog.close()
        _watchdog = None


def current() -> StallWatchdog | None:
    return _watchdog
