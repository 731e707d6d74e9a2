"""``iris run -n N [--timeout S] script.py [args...]``: start N ranks on this machine.

Each rank gets the environment Iris's bootstrap reads (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus IRIS_JOB_ID.
Output lines are prefixed with ``[rank R]``. When a rank fails, the others are
stopped and the launcher exits with that rank's exit code (128 + N for a rank
killed by signal N); after ``--timeout`` seconds each rank still running prints
every thread's Python stack (ranks that imported iris: see :func:`enable_stack_dumps`),
then every rank is stopped and the exit code is 124. Shared-memory segments of the
job are removed at the end, also when a rank crashed.
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

from iris.runtime.cpu import SEGMENT_PREFIX

TIMEOUT_EXIT_CODE = 124
STOP_GRACE_SECONDS = 5.0
STACK_DUMP_SECONDS = 2.0  # how long a timed-out rank gets to print its stacks
STACKS_ENV = "IRIS_STACKS_ON_SIGUSR1"


def enable_stack_dumps() -> None:
    """Under ``iris run``, make SIGUSR1 print every thread's Python stack to stderr (called by ``import iris``).

    The launcher sends SIGUSR1 to the ranks still running at its timeout, so a hang says where
    each rank waits. faulthandler writes from its signal handler, also while the rank blocks in C.
    """
    if os.environ.get(STACKS_ENV) == "1":
        import faulthandler

        faulthandler.register(signal.SIGUSR1, all_threads=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environment(rank: int, world: int, port: int, job: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), IRIS_JOB_ID=job, PYTHONUNBUFFERED="1",
    )
    env[STACKS_ENV] = "1"
    return env


def _pump(stream, rank: int, sink, lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        with lock:
            sink.write(f"[rank {rank}] {line}" if line.endswith("\n") else f"[rank {rank}] {line}\n")
            sink.flush()
    stream.close()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _dump_stacks(procs) -> None:
    """SIGUSR1 to each rank (see :func:`enable_stack_dumps`), then a moment for the output to arrive."""
    for p in procs:
        try:
            p.send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(STACK_DUMP_SECONDS)


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for p in procs:
        try:
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def remove_job_segments(job: str) -> list[str]:
    """Delete the job's shared-memory segments that a crashed rank left behind."""
    removed = []
    for path in glob.glob(f"/dev/shm/{SEGMENT_PREFIX}{job}_*"):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def run(nprocs: int, command: list[str], timeout: float | None = None, sink=None) -> int:
    """Run ``command`` (``[script, args...]`` or ``[-m, module, ...]``) as ``nprocs`` ranks; returns the exit code."""
    if nprocs < 1:
        raise ValueError(f"-n {nprocs}: need at least one rank")
    sink = sink or sys.stdout
    job, port, lock = uuid.uuid4().hex[:8], free_port(), threading.Lock()
    procs, pumps = [], []
    for rank in range(nprocs):
        p = subprocess.Popen([sys.executable, *command], env=rank_environment(rank, nprocs, port, job),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        t = threading.Thread(target=_pump, args=(p.stdout, rank, sink, lock), daemon=True)
        t.start()
        procs.append(p)
        pumps.append(t)
    start, code = time.monotonic(), 0
    try:
        while True:
            states = [p.poll() for p in procs]
            failed = [(r, c) for r, c in enumerate(states) if c not in (None, 0)]
            if failed:
                rank, returncode = failed[0]
                code = _exit_code(returncode)
                with lock:
                    sink.write(f"[iris run] rank {rank} exited with code {code}; stopping the other ranks\n")
                break
            if all(c == 0 for c in states):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                code = TIMEOUT_EXIT_CODE
                with lock:
                    waiting = [r for r, c in enumerate(states) if c is None]
                    sink.write(f"[iris run] timeout after {timeout:g} s; ranks {waiting} still running: their stacks "
                               "follow, then they are stopped\n")
                _dump_stacks([procs[r] for r in waiting])
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        code = 130
    finally:
        _stop(procs)
        for t in pumps:
            t.join(timeout=5)
        remove_job_segments(job)
    return code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="iris", description="Iris command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser("run", help="run a script as N ranks on this machine")
    run_parser.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    run_parser.add_argument("--timeout", type=float, default=None, help="stop every rank after this many seconds")
    run_parser.add_argument("script", help="Python script to run (or -m module)")
    run_parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    args = parser.parse_args(argv)
    if args.nprocs < 1:
        parser.error(f"-n {args.nprocs}: need at least one rank")
    return run(args.nprocs, [args.script, *args.args], timeout=args.timeout)


if __name__ == "__main__":
    sys.exit(main())
