"""``iris run -n N [--timeout S] [--cpu-bind] script.py [args...]`` (or ``-m module [args...]``): start N ranks on
this machine.

Each rank runs with torchrun's variables (RANK, WORLD_SIZE, ...; all in :data:`iris.config.VARIABLES`), its
output lines prefixed ``[rank R]``. When a rank fails, the others are stopped and the launcher exits with its
code (128 + N for signal N); after ``--timeout`` seconds every rank prints its Python stacks, then all stop
with code 124. Nothing outlives the launcher: SIGTERM, SIGHUP and SIGINT are forwarded, ranks die with a
SIGKILLed launcher (Linux), and the job's shared-memory segments are removed at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid

from iris import config
from iris.runtime.cpu_binding import binding, cpu_list
from iris.runtime import device_facts
from iris.runtime.shm import remove_stale_segments

TIMEOUT_EXIT_CODE = 124
STOP_GRACE_SECONDS = 5.0
STACK_DUMP_SECONDS = 15.0  # the most a timed-out rank gets to print its stacks
STACK_DUMP_QUIET_SECONDS = 0.5  # a dump is over once every signalled rank has spoken and then been this quiet
#: seconds the other ranks may run on after one ends with code 0 (``--early-exit-grace``)
EARLY_EXIT_GRACE_SECONDS = 120.0
#: seconds after which the launcher says that ranks outlive one that ended with code 0
EARLY_EXIT_NOTE_SECONDS = 10.0
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
CRASH_SIGNALS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE)
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def free_port() -> int:
    """A port for the ranks' rendezvous, free now, drawn below Linux's ephemeral range so that other jobs'
    outgoing connections cannot take it before rank 0 binds it."""
    # System randomness: jobs started side by side with a seeded random module would draw the same port.
    for port in random.SystemRandom().sample(range(20000, 32768), 64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # all taken: any port the system gives
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_command(command: list[str]) -> list[str]:
    """A rank's command line: ``python *command``, through the cross-compile gate's runner where it is asked for."""
    if config.cross_compile_targets() and not device_facts().compiles_kernels:
        return [sys.executable, "-m", "iris.testing.cross_compile", "--run", *command]
    return [sys.executable, *command]


def rank_environment(rank: int, world: int, port: int, job: str) -> dict[str, str]:
    return config.child_environment(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), IRIS_JOB_ID=job, PYTHONUNBUFFERED="1",
        IRIS_STACKS_ON_SIGUSR1="1",
        PYTHONFAULTHANDLER="1",  # a segmentation fault prints the rank's Python stack
    )


class _Stopped(Exception):
    """The launcher received one of FORWARDED_SIGNALS."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum, frame):
    for s in FORWARDED_SIGNALS:  # a second signal must not interrupt the stopping
        signal.signal(s, signal.SIG_IGN)
    raise _Stopped(signum)


def _die_with_launcher_hook():
    """A ``preexec_fn``: the rank gets SIGKILL when the launcher dies, however it dies (Linux only)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: ranks are stopped by the signal handlers only
        return None
    launcher = os.getpid()

    def hook():
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != launcher:  # the launcher died before the call
            os._exit(1)

    return hook


def _rank_setup(hook, cpus):
    """A ``preexec_fn``: SIGUSR1 ignored until a context turns stack dumps on (else it kills), ``hook``, ``cpus``."""
    def start():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        if hook is not None:
            hook()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    return start


def _pump(stream, rank: int, sink, lock, heard) -> None:
    """Copy the rank's lines to ``sink`` with its prefix; ``heard[rank]``: when its last line came."""
    for raw in iter(stream.readline, b""):
        heard[rank] = time.monotonic()
        line = raw.decode(errors="replace")
        with lock:
            sink.write(f"[rank {rank}] {line}" if line.endswith("\n") else f"[rank {rank}] {line}\n")
            sink.flush()
    stream.close()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _dump_stacks(procs, ranks, heard) -> list[int]:
    """SIGUSR1 to each of ``ranks``, then wait for their stacks; returns the running ranks that printed nothing.

    The wait ends once every rank has spoken and all have been quiet a while, as a loaded host can be slow."""
    signalled = time.monotonic()
    for rank in ranks:
        try:
            procs[rank].send_signal(signal.SIGUSR1)
        except ProcessLookupError:
            pass
    while time.monotonic() - signalled < STACK_DUMP_SECONDS:
        if all(heard[r] > signalled or procs[r].poll() is not None for r in ranks) and \
                time.monotonic() - max(heard[r] for r in ranks) > STACK_DUMP_QUIET_SECONDS:
            break
        time.sleep(0.05)
    return [r for r in ranks if heard[r] <= signalled and procs[r].poll() is None]


def _stop(procs, signum: int = signal.SIGTERM) -> None:
    """``signum`` to every rank's process group, STOP_GRACE_SECONDS to exit, then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signum)
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


#: what a signal that ended a rank usually means, beside its name
SIGNAL_MEANINGS = {signal.SIGKILL: "killed: by the out-of-memory killer, a scheduler or kill -9",
                   signal.SIGTERM: "asked to stop", signal.SIGINT: "interrupted", signal.SIGABRT: "aborted"}


def _failure_message(rank: int, returncode: int) -> str:
    code = _exit_code(returncode)
    message = f"[iris run] rank {rank} exited with code {code}"
    if -returncode in CRASH_SIGNALS:
        message += (f" ({signal.Signals(-returncode).name}; its Python stack is above; a device access outside the "
                    "heap or the world ends like this: rerun with IRIS_DEBUG=1 to have it named)")
    elif returncode < 0:
        number = -returncode
        name = signal.Signals(number).name if number in signal.Signals._value2member_map_ else f"signal {number}"
        meaning = SIGNAL_MEANINGS.get(number)
        message += f" ({name}: {meaning})" if meaning else f" ({name})"
    return message + "; stopping the other ranks\n"


def _watch(procs, timeout, sink, lock, heard, early_exit_grace: float = EARLY_EXIT_GRACE_SECONDS) -> int:
    """Wait for the ranks; the exit code of the job (the first failure, the timeout, 1 when ranks outlive a rank
    that ended with code 0 by more than ``early_exit_grace`` seconds, or 0)."""
    start = time.monotonic()
    first_done = None  # (rank, when) of the first rank that ended with code 0
    while True:
        states = [p.poll() for p in procs]
        failed = [(r, c) for r, c in enumerate(states) if c not in (None, 0)]
        if failed:
            rank, returncode = failed[0]
            with lock:
                sink.write(_failure_message(rank, returncode))
            return _exit_code(returncode)
        if all(c == 0 for c in states):
            return 0
        waiting = [r for r, c in enumerate(states) if c is None]
        if first_done is None and len(waiting) < len(procs):
            first_done = (states.index(0), time.monotonic(), [False])  # (rank, when, said so)
        alone = 0.0 if first_done is None else time.monotonic() - first_done[1]
        if first_done is not None and not first_done[2][0] and alone > min(EARLY_EXIT_NOTE_SECONDS,
                                                                           early_exit_grace / 2):
            first_done[2][0] = True  # ranks that finish a little apart are normal: say it only after a while
            with lock:
                sink.write(f"[iris run] rank {first_done[0]} ended (code 0) {alone:.0f} s ago while ranks {waiting} "
                           f"still run; if they wait for it, they are stopped {early_exit_grace:g} s after it ended "
                           "(--early-exit-grace)\n")
        if first_done is not None and alone > early_exit_grace:
            return _stop_waiting(procs, waiting, sink, lock, heard, 1,
                                 f"ranks {waiting} did not end within {early_exit_grace:g} s of rank {first_done[0]}, "
                                 "which ended with code 0: a rank that leaves a job before its peers' last collective "
                                 "leaves them waiting")
        if timeout is not None and time.monotonic() - start > timeout:
            return _stop_waiting(procs, waiting, sink, lock, heard, TIMEOUT_EXIT_CODE,
                                 f"timeout after {timeout:g} s; ranks {waiting} still running")
        time.sleep(0.05)


def _stop_waiting(procs, waiting, sink, lock, heard, code: int, why: str) -> int:
    """Print ``why``, the stacks of the ``waiting`` ranks, and return ``code`` (the caller stops them)."""
    with lock:
        sink.write(f"[iris run] {why}: their stacks follow, then they are stopped\n")
    silent = _dump_stacks(procs, waiting, heard)
    with lock:
        for rank in silent:
            sink.write(f"[iris run] rank {rank} printed no stack in {STACK_DUMP_SECONDS:g} s: a rank prints "
                       "its stacks once it has made an Iris context (iris.iris())\n")
        sink.flush()
    return code


def run(nprocs: int, command: list[str], timeout: float | None = None, sink=None, cpu_bind: bool | None = None,
        early_exit_grace: float = EARLY_EXIT_GRACE_SECONDS) -> int:
    """Run ``command`` (``[script, args...]`` or ``[-m, module, ...]``) as ``nprocs`` ranks; returns the exit code.

    ``cpu_bind``: each rank on cores of its own; None: as IRIS_CPU_BIND says. ``early_exit_grace``: seconds the
    other ranks may run on after one ends with code 0, before they are taken as waiting for it and stopped.

    Example:
        >>> run(2, ["examples/01_store/example.py", "--validate"], timeout=300)
        0
    """
    if nprocs < 1:
        raise ValueError(f"-n {nprocs}: need at least one rank")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"--timeout {timeout:g}: must be positive (seconds)")
    sink = sink or sys.stdout
    placed = binding(nprocs) if (config.cpu_bind_requested() if cpu_bind is None else cpu_bind) else None
    if placed:
        sink.write("[iris run] CPUs: " + ", ".join(f"rank {r} {cpu_list(cpus)}" for r, cpus in enumerate(placed))
                   + "\n")
    job, port, lock = uuid.uuid4().hex[:8], free_port(), threading.Lock()
    handling = threading.current_thread() is threading.main_thread()  # only there can Python handle signals
    previous = {s: signal.signal(s, _raise_stopped) for s in FORWARDED_SIGNALS} if handling else {}
    procs, pumps, stop_with, code = [], [], signal.SIGTERM, 0
    heard = [0.0] * nprocs  # when each rank's last line came (its pump thread writes it)
    try:
        hook = _die_with_launcher_hook()
        for rank in range(nprocs):  # every rank before any pump thread: preexec_fn wants no other thread
            procs.append(subprocess.Popen(rank_command(command), env=rank_environment(rank, nprocs, port, job),
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                          preexec_fn=_rank_setup(hook, placed[rank] if placed else None)))
        for rank, p in enumerate(procs):
            pumps.append(threading.Thread(target=_pump, args=(p.stdout, rank, sink, lock, heard), daemon=True))
            pumps[-1].start()
        code = _watch(procs, timeout, sink, lock, heard, early_exit_grace)
    except (_Stopped, KeyboardInterrupt) as stop:
        stop_with = stop.signum if isinstance(stop, _Stopped) else signal.SIGINT
        code = 128 + stop_with
        with lock:
            sink.write(f"[iris run] {signal.Signals(stop_with).name} received: forwarding it to the ranks, "
                       f"killing those still running after {STOP_GRACE_SECONDS:g} s\n")
    finally:
        for s in previous:  # a signal must not interrupt the cleanup below
            signal.signal(s, signal.SIG_IGN)
        _stop(procs, stop_with)
        for t in pumps:
            t.join(timeout=5)
        remove_stale_segments(f"{job}_*")  # every rank has exited: the job's segments are stale
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code


def build_parser() -> argparse.ArgumentParser:
    """The ``iris`` command line: ``iris run``, ``iris info`` and ``iris cleanup``.

    Only argparse here: the CLI page is rendered from it without importing torch.
    """
    parser = argparse.ArgumentParser(prog="iris", description="Iris command-line tools")
    sub = parser.add_subparsers(dest="command", required=True)
    run_parser = sub.add_parser(
        "run", help="run a script (or a module, with -m) as N ranks on this machine",
        usage="iris run [-h] -n NPROCS [--timeout TIMEOUT] [--early-exit-grace SECONDS] [--cpu-bind] "
              "(script [args ...] | -m MODULE [args ...])")
    run_parser.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    run_parser.add_argument("--timeout", type=float, default=None, help="stop every rank after this many seconds")
    # 120: EARLY_EXIT_GRACE_SECONDS, written out (the CLI page renders this function alone)
    run_parser.add_argument("--early-exit-grace", type=float, default=120.0, metavar="SECONDS",
                            help="once a rank ends with code 0, how long the others may run on before they are "
                                 "taken as waiting for it and stopped, exit code 1 (default %(default)g)")
    run_parser.add_argument("--cpu-bind", action="store_true", default=None,
                            help="give each rank cores of its own, spread over the NUMA nodes (IRIS_CPU_BIND=1)")
    # -m takes the rest of the line, as python -m does
    run_parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, metavar="MODULE",
                            help="run this module as each rank's program (python -m MODULE); every word after it "
                                 "is the module's")
    run_parser.add_argument("script", nargs="?", help="the Python script each rank runs")
    run_parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments of the script")
    sub.add_parser("cleanup", help="remove the shared-memory segments that killed ranks left in /dev/shm")
    info_parser = sub.add_parser(
        "info", help="versions, backend, GPUs, heap providers, switches and settings, for a bug report")
    info_parser.add_argument("--json", action="store_true", help="the same facts as JSON")
    return parser


def rank_program(args: argparse.Namespace) -> list[str]:
    """The ranks' program as ``python`` takes it, from ``iris run``'s parsed arguments.

    Raises:
        ValueError: neither a script nor a module, or ``-m`` without a module's name.

    Example:
        >>> rank_program(build_parser().parse_args(["run", "-n", "2", "-m", "pkg.mod", "--flag"]))
        ['-m', 'pkg.mod', '--flag']
    """
    if args.module is not None:
        if not args.module:
            raise ValueError("-m needs a module name: iris run -n N -m package.module [args ...]")
        return ["-m", *args.module]
    if args.script is None:
        raise ValueError("give a script or -m MODULE: iris run -n N script.py [args ...]")
    return [args.script, *args.args]


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        from iris.launch.info import collect, render  # imported here: `iris run` stays light

        facts = collect()
        print(json.dumps(facts, indent=2) if args.json else render(facts))
        return 0
    if args.command == "cleanup":
        removed = remove_stale_segments()
        for path in removed:
            print(f"removed {path}")
        print(f"{len(removed)} stale segment(s) removed; segments of running jobs are kept")
        return 0
    if args.nprocs < 1:
        parser.error(f"-n {args.nprocs}: need at least one rank")
    if args.timeout is not None and not args.timeout > 0:
        parser.error(f"--timeout {args.timeout:g}: must be positive (seconds)")
    try:
        program = rank_program(args)
        config.check_switches()  # every rank would refuse a switch it cannot read: say so once, before they start
        cpu_bind = config.cpu_bind_requested() if args.cpu_bind is None else args.cpu_bind
    except ValueError as exc:
        parser.error(str(exc))
    if not args.early_exit_grace > 0:
        parser.error(f"--early-exit-grace {args.early_exit_grace:g}: must be positive (seconds)")
    return run(args.nprocs, program, timeout=args.timeout, cpu_bind=cpu_bind, early_exit_grace=args.early_exit_grace)


if __name__ == "__main__":
    sys.exit(main())
