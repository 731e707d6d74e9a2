"""A persistent group of N rank processes that run the same function on request.

Starting ranks costs seconds, so a test session starts one pool per world size and reuses it:

    >>> pool = RankPool(2)
    >>> pool.run(my_check, 42)        # my_check(42) runs on every rank
    [result_of_rank_0, result_of_rank_1]

The function must be a module-level function of an importable module (sent by name). A rank that raises,
crashes or hangs makes ``run`` raise :class:`RankFailure`; a dead or hung pool restarts on the next call.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import signal
import subprocess
import tempfile
import time
import traceback
import uuid
from multiprocessing.connection import wait

from iris import config
from iris.runtime.shm import memory_available

DEFAULT_TIMEOUT = config.test_timeout_s()


class RankFailure(AssertionError):
    """One or more ranks failed; ``failures`` maps rank -> description; ``hung``: none answered in time."""

    def __init__(self, failures: dict[int, str], what: str, hung: bool = False):
        self.failures = failures
        self.hung = hung
        body = "\n".join(f"--- rank {r} ---\n{text}" for r, text in sorted(failures.items()))
        super().__init__(f"{what} failed on rank(s) {sorted(failures)}:\n{body}")


#: how long a hung rank is given to write its stacks after SIGUSR1 (see RankPool._stacks)
STACK_WAIT_S = 10


#: how long a stack file must stay the same before it is taken as whole (faulthandler writes it in pieces)
STACK_SETTLE_S = 0.5


def read_when_settled(paths: dict[int, str], deadline: float) -> dict[int, str]:
    """The text of each file of ``paths`` (rank -> path), once all are non-empty and settled, or at ``deadline``.

    Why wait: faulthandler writes a stack in pieces.
    """
    def read(path: str) -> str:
        try:
            with open(path) as file:
                return file.read().strip()
        except OSError:
            return ""

    texts = {rank: read(path) for rank, path in paths.items()}
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = {rank: read(path) for rank, path in paths.items()}
        if now != texts:
            texts, since = now, time.monotonic()
        elif all(texts.values()) and time.monotonic() - since >= STACK_SETTLE_S:
            break
    return texts


def _stack_file(job: str, rank: int) -> str:
    return os.path.join(tempfile.gettempdir(), f"iris-{job}-rank{rank}.stack")


def _worker(rank: int, world: int, port: int, job: str, conn) -> None:
    # iris must not point SIGUSR1 back at stderr (IRIS_STACKS_ON_SIGUSR1): the driver reads the stacks from a file
    config.export(drop=("IRIS_STACKS_ON_SIGUSR1",), RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                  LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), IRIS_JOB_ID=job)
    # SIGUSR1 writes every thread's stack here, even while the rank blocks in C
    stacks = open(_stack_file(job, rank), "a")  # noqa: SIM115  (open for the life of the process)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    import iris  # noqa: F401  (backend choice and interpreter switch before any test kernel is imported)
    from iris.testing.cross_compile import install_if_asked

    install_if_asked()  # IRIS_CROSS_COMPILE on the CPU backend: every launch here compiled for GPUs first

    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        fn, args, kwargs = message
        try:
            _reply(conn, "ok", fn(*args, **kwargs))
        except BaseException:  # report everything, including assertion errors and SystemExit
            failure = traceback.format_exc()
            if "out of memory" in failure:
                failure += _memory_report()
            _reply(conn, "error", failure)


def _memory_report() -> str:
    """How full the host and GPUs were, told by the rank that ran out of memory while it still can."""
    available = memory_available()
    host = f"{available >> 20} MiB available" if available is not None else "/proc/meminfo unreadable"
    lines = ["memory when this failed:", f"  host: {host}"]
    for query in (["--query-gpu=index,memory.used,memory.total", "--format=csv,noheader"],
                  ["--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader"]):
        try:
            answer = subprocess.run(["nvidia-smi", *query], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            break
        rows = answer.strip().splitlines()
        lines.append(f"  nvidia-smi {query[0]}: {len(rows)} rows")
        lines += [f"    {row}" for row in rows[:80]]
    return "\n".join(lines) + "\n"


def _reply(conn, status: str, payload) -> None:
    """Send a result with the standard pickler: torch's would move a CPU heap tensor's storage off the heap."""
    conn.send_bytes(pickle.dumps((status, payload)))


class RankPool:
    """``world_size`` rank processes, started on first use and kept for reuse.

    Args:
        world_size: number of ranks.
        timeout: seconds a call may take before the ranks still running are
            declared hung (default IRIS_TEST_TIMEOUT or 300).
    """

    def __init__(self, world_size: int, timeout: float = DEFAULT_TIMEOUT):
        if world_size < 1:
            raise ValueError(f"world_size={world_size}: need at least one rank")
        self.world_size = world_size
        self.timeout = timeout
        self._procs: list = []
        self._conns: list = []
        self.job = ""

    def _start(self) -> None:
        from iris.launch import free_port

        ctx = mp.get_context("spawn")
        port, self.job = free_port(), uuid.uuid4().hex[:8]
        for rank in range(self.world_size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(rank, self.world_size, port, self.job, child), daemon=True,
                               name=f"iris-rank-{rank}")
            proc.start()
            child.close()
            self._procs.append(proc)
            self._conns.append(parent)

    def close(self) -> None:
        """Stop every rank (politely, then by force) and remove the job's shared memory."""
        from iris.runtime.shm import remove_stale_segments

        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 5
        for proc in self._procs:
            proc.join(timeout=max(deadline - time.monotonic(), 0.01))
            if proc.is_alive():
                proc.kill()
                proc.join()
        for conn in self._conns:
            conn.close()
        if self.job:
            remove_stale_segments(f"{self.job}_*")  # the ranks have exited: their segments are stale
            for rank in range(self.world_size):
                try:
                    os.remove(_stack_file(self.job, rank))
                except OSError:
                    pass
        self._procs, self._conns = [], []

    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every rank; return the results by rank.

        Raises:
            RankFailure: a rank raised, died, or did not answer within the timeout.
        """
        if not self._procs:
            self._start()
        what = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        for conn in self._conns:
            conn.send((fn, args, kwargs))
        limit = self.timeout if timeout is None else timeout
        started = time.monotonic()
        deadline = started + limit
        results: dict[int, object] = {}
        failures: dict[int, str] = {}
        lost = False  # a rank died or hung: the pool must be restarted
        hung = False  # the whole limit passed with no rank failing first
        pending = dict(enumerate(self._conns))
        while pending:
            ready = wait(list(pending.values()), timeout=max(deadline - time.monotonic(), 0))
            if not ready:
                waited = time.monotonic() - started
                stacks = self._stacks(list(pending))
                hung = not failures
                for rank in pending:
                    failures[rank] = (f"no answer after {waited:.0f} s (hung, or waiting on a failed rank); "
                                      f"its stack:\n{stacks[rank]}")
                lost = True
                break
            for rank, conn in list(pending.items()):
                if conn not in ready:
                    continue
                del pending[rank]
                try:
                    status, payload = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    self._procs[rank].join(timeout=5)
                    failures[rank] = f"rank process died (exit code {self._procs[rank].exitcode})"
                    lost = True
                    continue
                if status == "ok":
                    results[rank] = payload
                else:
                    failures[rank] = payload
            if failures and pending:
                # A failed rank usually leaves its peers waiting forever: give them a moment, then stop.
                deadline = min(deadline, time.monotonic() + 10)
        if failures:
            if lost:
                self.close()
            raise RankFailure(failures, what, hung=hung)
        return [results[r] for r in range(self.world_size)]

    def _stacks(self, ranks: list[int]) -> dict[int, str]:
        """The Python stacks of ``ranks`` (still running), by SIGUSR1 and faulthandler."""
        for rank in ranks:
            path = _stack_file(self.job, rank)
            open(path, "w").close()
            try:
                os.kill(self._procs[rank].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        # A rank blocked in the driver takes the signal only when the call returns: wait for every answer.
        stacks = read_when_settled({rank: _stack_file(self.job, rank) for rank in ranks},
                                   time.monotonic() + STACK_WAIT_S)
        return {rank: text[:4000] or f"(no stack: the rank did not answer SIGUSR1 within {STACK_WAIT_S} s; a "
                                     "process blocked in a driver call takes it only when the call returns)"
                for rank, text in stacks.items()}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
