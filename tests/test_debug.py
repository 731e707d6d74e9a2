"""IRIS_DEBUG: a wait that is never signalled gives up and says who waited on what."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

NEVER_SIGNALLED = """
import torch, triton, triton.language as tl
import iris

@triton.jit
def wait_for_flag(flag, rank):
    if rank == 0:
        iris.wait_until(flag + 3, "==", 1)   # nobody ever signals it

ctx = iris.iris(1 << 16, debug={debug})
flags = ctx.zeros(8, dtype=torch.int32)
ctx.barrier()
wait_for_flag[(1,)](flags, ctx.get_rank())
try:
    ctx.barrier()
except iris.WaitTimeoutError as exc:
    print("CAUGHT", exc, flush=True)
    raise SystemExit(7)
print("no timeout", flush=True)
"""

ABSENT_PEER = """
import iris
ctx = iris.iris(1 << 16)
if ctx.get_rank() == 0:
    try:
        ctx.device_barrier()          # rank 1 never comes
    except iris.WaitTimeoutError as exc:
        print("CAUGHT", exc, flush=True)
        raise SystemExit(7)
"""

COUNTS_APART = """
import iris
from iris.ccl import Config
ctx = iris.iris(1 << 16)
x = ctx.ones(100)
if ctx.get_rank() == 1:
    ctx.team.region("ccl.ll_counts").add_(4)  # as after calls that failed part-way on rank 1 alone: 5, not 1
try:
    ctx.ccl.all_reduce(x, x, config=Config(all_reduce_variant="ll"))
except iris.WaitTimeoutError as exc:
    print("CAUGHT", exc, flush=True)
    raise SystemExit(7)
"""


def _launch(tmp_path, script, env_extra):
    path = tmp_path / "hang.py"
    path.write_text(textwrap.dedent(script))
    env = {**os.environ, "IRIS_WAIT_TIMEOUT": "1", **env_extra}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run([sys.executable, "-m", "iris", "run", "-n", "2", "--timeout", "120", str(path)],
                          capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["env", "argument"])
def test_unsignalled_wait_names_rank_program_address_and_values(tmp_path, how):
    script = NEVER_SIGNALLED.format(debug="True" if how == "argument" else "False")
    proc = _launch(tmp_path, script, {"IRIS_DEBUG": "1"} if how == "env" else {})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 7, out
    line = next(text for text in out.splitlines() if "CAUGHT" in text)
    assert line.startswith("[rank 0]")
    assert "rank 0 program 0" in line
    assert re.search(r"heap offset 0x[0-9a-f]+ of rank 0", line), line
    offset = int(re.search(r"heap offset (0x[0-9a-f]+)", line)[1], 16)
    assert offset % 256 == 12  # flags + 3 in int32, flags itself 256-byte aligned
    assert "== 1" in line and "last saw 0" in line and "gave up after" in line


@pytest.mark.slow
def test_absent_peer_in_device_barrier_is_named(tmp_path):
    proc = _launch(tmp_path, ABSENT_PEER, {"IRIS_DEBUG": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 7, out
    line = next(text for text in out.splitlines() if "CAUGHT" in text)
    assert "device_barrier" in line and "rank 1" in line and "rank 0 program 0" in line, line


@pytest.mark.slow
def test_landing_words_that_never_carry_the_awaited_number_are_named(tmp_path):
    """all_reduce's ll variant waits on its landing words themselves: bounded like every wait in debug mode."""
    proc = _launch(tmp_path, COUNTS_APART, {"IRIS_DEBUG": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 7, out
    line = next(text for text in out.splitlines() if text.startswith("[rank 0]") and "CAUGHT" in text)
    # the first program to give up fills the record: program 0 with it in device memory, program 1 on an H100
    # with IRIS_RECORD_ON_HOST (its atomics cross PCIe)
    assert re.search(r"rank 0 program \d+ ", line) and "== 1" in line and "last saw 5" in line, line


BAD_ACCESS = """
import torch, triton, triton.language as tl
import iris

@triton.jit
def access(buf, n, rank, peer, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    iris.store(buf + offs, offs, rank, peer, heap_bases, mask=offs < n)

@triton.jit
def read(buf, n, rank_a, rank_b, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    iris.get(buf + offs, buf + offs, rank_a, rank_b, heap_bases, mask=offs < n)

ctx = iris.iris(1 << 16, debug=True)
rank = ctx.get_rank()
tail = ctx.zeros(100, dtype=torch.int32)
ctx.barrier()
access[(1,)](tail, 100, rank, 1 - rank, ctx.get_heap_bases(), BLOCK=128)  # lanes past n are masked: fine
ctx.barrier()
print("MASKED OK", flush=True)
case = "{case}"
if rank == 0:
    if case == "rank":
        access[(1,)](tail, 100, rank, 2, ctx.get_heap_bases(), BLOCK=128)      # there is no rank 2
    elif case == "neither":
        read[(1,)](tail, 100, 1, 1, ctx.get_heap_bases(), BLOCK=128)           # rank 0 is neither of them
    else:
        off_heap = torch.zeros(128, dtype=torch.int32, device=ctx.get_device())
        access[(1,)](off_heap, 100, rank, 1, ctx.get_heap_bases(), BLOCK=128)  # not a heap pointer
try:
    ctx.barrier()
except iris.DeviceAccessError as exc:
    print("CAUGHT", exc, flush=True)
    raise SystemExit(7)
print("no error", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", ["rank", "pointer", "neither"])
def test_debug_reports_rank_out_of_range_and_pointer_outside_the_heap(tmp_path, case):
    proc = _launch(tmp_path, BAD_ACCESS.replace("{case}", case), {})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 7, out
    assert "MASKED OK" in out, out
    line = next(text for text in out.splitlines() if "CAUGHT" in text)
    assert line.startswith("[rank 0]") and "rank 0 program 0" in line, line
    if case == "rank":
        assert "to rank 2" in line and "world of 2 ranks" in line, line
    elif case == "neither":
        assert "named ranks 1 and 1, neither of them the current rank 0" in line, line
    else:
        assert "outside the heap" in line and "rank 0" in line, line


MISMATCHED_COLLECTIVE = """
import iris
from iris.ccl import ReduceOp

ctx = iris.iris(1 << 20, debug=True)
rank = ctx.get_rank()
if "{case}" == "shape":
    x, op = ctx.ones(16 if rank == 0 else 8), ReduceOp.SUM      # rank 1 passes half the elements
else:
    x, op = ctx.ones(8), ReduceOp.MAX if rank == 0 else ReduceOp.SUM
try:
    ctx.ccl.all_reduce(x, x, op=op)
except ValueError as exc:
    print("CAUGHT", exc, flush=True)
    raise SystemExit(7)
"""


@pytest.mark.slow
@pytest.mark.parametrize("case", ["shape", "op"])
def test_debug_mode_catches_a_collective_called_differently_on_each_rank(tmp_path, case):
    proc = _launch(tmp_path, MISMATCHED_COLLECTIVE.replace("{case}", case), {})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 7, out
    caught = [line for line in out.splitlines() if "CAUGHT" in line]
    assert len(caught) == 2, out  # on both ranks, before any kernel ran
    for line in caught:
        assert "all_reduce: the ranks of the group called it differently" in line, line
        if case == "shape":
            assert "input_tensor: rank 0 (16,) float32, rank 1 (8,) float32" in line, line
        else:
            assert "op: rank 0 <ReduceOp.MAX" in line and "rank 1 <ReduceOp.SUM" in line, line


STALLED_PEER = """
import time
import iris
ctx = iris.iris(1 << 16, debug=True)
x = ctx.ones(16)
if ctx.get_rank() == 1:
    time.sleep(60)  # stops calling collectives
    raise SystemExit(0)
started = time.monotonic()
try:
    ctx.ccl.all_reduce(x, x)
except iris.WaitTimeoutError as exc:
    print("CAUGHT", f"{time.monotonic() - started:.1f}", exc, flush=True)
    raise SystemExit(7)
"""


@pytest.mark.slow
def test_debug_modes_agreement_check_gives_up_on_a_stalled_peer_and_names_it(tmp_path):
    """The host-side check of a collective's arguments waits for the peers no longer than IRIS_WAIT_TIMEOUT
    (it waited for ever on a peer that stopped calling collectives)."""
    proc = _launch(tmp_path, STALLED_PEER, {"IRIS_WAIT_TIMEOUT": "3"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 7, out
    line = next(text for text in out.splitlines() if "CAUGHT" in text)
    assert line.startswith("[rank 0] CAUGHT") and float(line.split()[3]) < 30, line
    assert "all_reduce" in line and "rank 1" in line and "IRIS_WAIT_TIMEOUT" in line, line


# A local read through iris.load, for the scripts below: given a pointer off the heap, debug mode reports it.
READ_LOCAL = """
import torch, triton, triton.language as tl
import iris

@triton.jit
def read_local(src, dst, rank, heap_bases, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(dst + offs, iris.load(src + offs, rank, rank, heap_bases))
"""

PER_CONTEXT = READ_LOCAL + """
def off_heap_read(ctx):
    # a pointer off the heap, read locally: harmless, but debug mode reports every access outside the heap
    src = torch.arange(64, dtype=torch.int32, device=ctx.get_device())
    dst = torch.zeros_like(src)
    read_local[(1,)](src, dst, ctx.get_rank(), ctx.get_heap_bases(), BLOCK=64)
    try:
        ctx.barrier()
    except iris.DeviceAccessError:
        return "reported"
    assert torch.equal(dst, src)
    return "read"

def mismatched_all_reduce(ctx):
    x = ctx.ones(16 if ctx.get_rank() == 0 else 8)   # read within the heap either way
    # two_shot, whose barriers pair up whatever the sizes: unchecked, the mismatch then runs to its end.
    # (The barrier-free variants, push and ll, wait for what the smaller member never sends, until
    # IRIS_WAIT_TIMEOUT: ll is the default at this size on 2 ranks.)
    config = iris.ccl.Config(all_reduce_variant="two_shot")
    try:
        ctx.ccl.all_reduce(x, x, config=config)
    except ValueError:
        return "refused"
    ctx.barrier()
    return "ran"

checked = iris.iris(1 << 20, debug=True)
plain = iris.iris(1 << 20)                  # a second context of the same process, not in debug mode
seen = [checked.debug_enabled, plain.debug_enabled, off_heap_read(checked), off_heap_read(plain),
        mismatched_all_reduce(checked), mismatched_all_reduce(plain)]
checked.set_debug(False)
seen += [off_heap_read(checked), mismatched_all_reduce(checked)]
checked.set_debug(True)
seen += [off_heap_read(checked), mismatched_all_reduce(checked)]
print("SEEN", seen, flush=True)
"""


@pytest.mark.slow
def test_debug_mode_is_switched_per_context(tmp_path):
    # without the normal mode's first-call comparison, a context out of debug mode runs the mismatch to its end
    proc = _launch(tmp_path, PER_CONTEXT, {"IRIS_AGREEMENT_CHECK": "0"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    seen = [line.split("SEEN ", 1)[1] for line in out.splitlines() if "SEEN" in line]
    expected = str([True, False, "reported", "read", "refused", "ran", "read", "ran", "reported", "refused"])
    assert seen == [expected, expected], out


REPORT_OUTLIVES_A_POLL = READ_LOCAL + """
import time
from iris.host import watchdog

ctx = iris.iris(1 << 16, debug=True)
src = torch.arange(64, dtype=torch.int32, device=ctx.get_device())
dst = torch.zeros_like(src)
read_local[(1,)](src, dst, ctx.get_rank(), ctx.get_heap_bases(), BLOCK=64)   # off the heap: reported
time.sleep(2.5 * watchdog.POLL_S)   # the stall watchdog (on by default) reads the record meanwhile
try:
    ctx.barrier()
except iris.DeviceAccessError as exc:
    print("REPORTED", exc, flush=True)
"""


@pytest.mark.slow
def test_a_debug_report_is_left_to_debug_mode_by_the_stall_watchdog(tmp_path):
    # the watchdog ends a rank on a wait that gave up; what debug mode reports after the call (here an access
    # outside the heap) is debug mode's to raise, however long the host takes to get there
    proc = _launch(tmp_path, REPORT_OUTLIVES_A_POLL, {"IRIS_STALL_TIMEOUT": "600"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert out.count("REPORTED") == 2 and "outside the heap" in out, out
    assert "stalled:" not in out, out


MOE_EXPERT_IDS = """
import torch
import iris

ctx = iris.iris(1 << 22, debug=True)
world, device = ctx.get_num_ranks(), ctx.get_device()
moe = ctx.ccl.moe_dispatcher(hidden_dim=8, num_experts=2 * world, topk=2, max_tokens=4, dtype=torch.float32)
x = torch.randn(4, 8, device=device)
idx = torch.arange(8, device=device).reshape(4, 2) % (2 * world)
idx[0, 0] = -1                                                   # one id below the range
idx[3, 1] = 2 * world                                            # and one above
try:
    moe.dispatch(x, idx, torch.rand(4, 2, device=device))
except ValueError as exc:
    print("REFUSED", exc, flush=True)
ctx.barrier()
"""


@pytest.mark.slow
def test_debug_mode_refuses_moe_expert_ids_out_of_range_before_any_launch(tmp_path):
    # outside debug mode such a slot is dropped (tests/test_moe.py); reading the ids needs the host, so only here
    proc = _launch(tmp_path, MOE_EXPERT_IDS, {})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    refused = [line for line in out.splitlines() if "REFUSED" in line]
    assert len(refused) == 2 and all("2 expert ids outside [0, " in line and "e.g. -1" in line for line in refused), out
