"""Faults and misuse across ranks, each run as a real job under ``iris run``: how long until every rank ended, the
exit code, the message that names the fault, and what the job left in /dev/shm (nothing, when all is well).

One rank (the last) misbehaves while the others call ``all_reduce``: it ends with code 0 or an exception, is
killed, sleeps (with ``IRIS_STALL_TIMEOUT``), or every rank misuses the API (ranks that disagree, a closed
context). ``tests/test_faults.py`` runs every scenario at 2 and 4 ranks (slow tier); ``python -m
iris.testing.faults`` prints the table.

Example:
    $ python -m iris.testing.faults --ranks 2 4
    | scenario | ranks | seconds | exit code | message | left in /dev/shm |
    ...
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time

from iris import config

_PROLOGUE = """
import os, signal, time
import iris
ctx = iris.iris(1 << 20)
rank, world = ctx.get_rank(), ctx.get_num_ranks()
faulty = rank == world - 1
if rank == 0:
    print("JOB", os.environ.get("IRIS_JOB_ID", ""), flush=True)
x = ctx.ones(256)
ctx.ccl.all_reduce(x, x)
ctx.barrier()
"""

_PEERS_CALL_ON = """
if faulty:
{fault}
for _ in range(50):
    ctx.ccl.all_reduce(x, x)
"""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A fault: the program's end (after the common prologue), its environment, launcher flags, the exit code the
    job must end with and a pattern its output must hold (the message that names the fault)."""

    name: str
    body: str
    exit_code: int
    message: str
    env: tuple[tuple[str, str], ...] = ()
    flags: tuple[str, ...] = ()


def _faulty(statement: str) -> str:
    return _PEERS_CALL_ON.format(fault=textwrap.indent(statement, "    "))


SCENARIOS = (
    Scenario("a rank exits 0 mid-job", _faulty("raise SystemExit(0)"), 1,
             r"ended with code 0", flags=("--early-exit-grace", "5")),
    Scenario("a rank raises", _faulty("raise RuntimeError('injected fault')"), 1,
             r"RuntimeError: injected fault"),
    Scenario("a rank is killed (SIGKILL)", _faulty("os.kill(os.getpid(), signal.SIGKILL)"), 137, r"SIGKILL"),
    Scenario("a rank stalls (IRIS_STALL_TIMEOUT=5)", _faulty("time.sleep(600)"), 75,
             r"stalled: .*gave up after", env=(("IRIS_STALL_TIMEOUT", "5"),)),
    Scenario("ranks disagree (1024 vs 2048 elements)",
             "y = ctx.ones(2048 if faulty else 1024)\nctx.ccl.all_reduce(y, y)\n", 1,
             r"ValueError: all_reduce: the ranks of the group called it differently .*rank 0 \(1024,\) float32, .*"
             r"rank \d \(2048,\) float32"),
    Scenario("ranks in different calls (IRIS_AGREEMENT_CHECK=5)",
             "y = x if faulty else ctx.ones(4096)  # the last rank repeats its first call, the others make a new one\n"
             "ctx.ccl.all_reduce(y, y)\n", 1,
             r"WaitTimeoutError: all_reduce's argument check: rank \d+ did not arrive within 5 s",
             env=(("IRIS_AGREEMENT_CHECK", "5"),)),
    Scenario("a call on a closed context", "ctx.close()\nctx.ccl.all_reduce(x, x)\n", 1,
             r"RuntimeError: all_reduce: this Iris context is closed"),
)


@dataclasses.dataclass
class Outcome:
    scenario: Scenario
    ranks: int
    seconds: float
    exit_code: int
    message: str  # the first line that matched the scenario's pattern ("" where none did)
    leftovers: list[str]
    output: str

    @property
    def as_expected(self) -> bool:
        return self.exit_code == self.scenario.exit_code and bool(self.message) and not self.leftovers


def run(scenario: Scenario, ranks: int, timeout: float = 120.0) -> Outcome:
    """Run ``scenario`` at ``ranks`` ranks under ``iris run`` (``--timeout``: a job that hangs ends at ``timeout``)."""
    with tempfile.TemporaryDirectory() as folder:
        program = os.path.join(folder, "fault.py")
        with open(program, "w") as file:
            file.write(_PROLOGUE + scenario.body)
        env = config.child_environment(**dict(scenario.env), PYTHONFAULTHANDLER="0")
        command = [sys.executable, "-m", "iris", "run", "-n", str(ranks), "--timeout", f"{timeout:g}",
                   *scenario.flags, program]
        started = time.monotonic()
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout + 60)
        seconds = time.monotonic() - started
    output = proc.stdout + proc.stderr
    job = re.search(r"JOB ([0-9a-f]+)", output)
    leftovers = sorted(glob.glob(f"/dev/shm/*{job[1]}*")) if job else ["(the job never printed its id)"]
    pattern = re.compile(scenario.message)
    message = next((line.strip() for line in output.splitlines() if pattern.search(line)), "")
    return Outcome(scenario, ranks, seconds, proc.returncode, message, leftovers, output)


def table(outcomes: list[Outcome], width: int = 160) -> str:
    """The outcomes as a Markdown table (each message cut to ``width`` characters)."""
    lines = ["| scenario | ranks | seconds | exit code | message | left in /dev/shm |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        message = o.message if len(o.message) <= width else o.message[:width - 3] + "..."
        lines.append(f"| {o.scenario.name} | {o.ranks} | {o.seconds:.1f} | {o.exit_code} | "
                     f"{message.replace('|', '/') or '(none)'} | {', '.join(o.leftovers) or 'nothing'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iris.testing.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4], help="world sizes (default: 2 4)")
    args = parser.parse_args(argv)
    outcomes = []
    for ranks in args.ranks:
        for scenario in SCENARIOS:
            outcome = run(scenario, ranks)
            outcomes.append(outcome)
            print(f"{scenario.name} at {ranks} ranks: exit {outcome.exit_code} in {outcome.seconds:.1f} s"
                  f"{'' if outcome.as_expected else ' (NOT as expected)'}", file=sys.stderr, flush=True)
    print(table(outcomes))
    return 0 if all(o.as_expected for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
