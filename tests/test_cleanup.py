"""Nothing left behind: ranks die with their launcher, a closed context frees its heap at once, failed
setups and killed ranks leave no shared memory, and a crash prints where it happened (CPU backend)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import iris
from iris.runtime import shm

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm (POSIX shared memory)")


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_until_gone(pids, seconds=20.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def _job_segments(job: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(f"{shm.SEGMENT_PREFIX}{job}_")]


# A rank that makes a context, leaves a segment of its job (as a crash mid-setup would), says so,
# then waits: what the launcher's signal finds.
_WAITING_RANK = """
    import os, time
    import iris
    ctx = iris.iris(1 << 16)
    leftover = "/dev/shm/iris_" + os.environ["IRIS_JOB_ID"] + "_left_" + os.environ["RANK"]
    open(leftover, "w").close()
    print("pid", os.getpid(), "job", os.environ["IRIS_JOB_ID"], flush=True)
    time.sleep(600)
"""


def _launch_and_signal(tmp_path, signum):
    script = tmp_path / "wait.py"
    script.write_text(textwrap.dedent(_WAITING_RANK))
    launcher = subprocess.Popen([sys.executable, "-m", "iris", "run", "-n", "2", str(script)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids, job, lines = [], None, []
    deadline = time.monotonic() + 120
    while len(pids) < 2 and time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if not line:
            break
        lines.append(line)
        if " pid " in line:
            words = line.split()
            pids.append(int(words[words.index("pid") + 1]))
            job = words[words.index("job") + 1]
    assert len(pids) == 2, "the ranks did not start:\n" + "".join(lines)
    launcher.send_signal(signum)
    rest, _ = launcher.communicate(timeout=60)
    return launcher.returncode, pids, job, "".join(lines) + rest


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_to_the_launcher_stops_every_rank_and_removes_the_jobs_memory(tmp_path, signum):
    code, pids, job, output = _launch_and_signal(tmp_path, signum)
    assert code == 128 + signum, output
    assert f"[iris run] {signum.name}" in output, output
    assert _wait_until_gone(pids) == [], f"ranks outlived the launcher:\n{output}"
    assert _job_segments(job) == [], output


@pytest.mark.slow
def test_ranks_die_with_a_killed_launcher(tmp_path):
    code, pids, job, output = _launch_and_signal(tmp_path, signal.SIGKILL)
    assert code == -signal.SIGKILL
    assert _wait_until_gone(pids) == [], f"ranks outlived the SIGKILLed launcher:\n{output}"
    for name in _job_segments(job):  # what no one could remove; only the script's stand-ins may be left
        assert "_left_" in name
        os.unlink(f"/dev/shm/{name}")


@pytest.mark.parametrize("timeout", ["0", pytest.param("-1", marks=pytest.mark.slow)])
def test_a_timeout_that_is_not_positive_is_refused(timeout):
    proc = subprocess.run([sys.executable, "-m", "iris", "run", "-n", "2", "--timeout", timeout, "x.py"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--timeout" in proc.stderr and "positive" in proc.stderr, proc.stderr


def _memory_use() -> tuple[int, int, int]:
    """(bytes resident, bytes of shared memory resident, iris segments mapped) of this process."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            fields[name] = value.split()
    with open("/proc/self/maps") as f:
        segments = {line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                    for line in f if "/iris_" in line}
    return int(fields["VmRSS"][0]) * 1024, int(fields["RssShmem"][0]) * 1024, len(segments)


def _device_memory_used() -> int:
    """Bytes of GPU memory this process holds, 0 on the CPU backend (the heap is shared memory).

    From the driver's per-process accounting (nvidia-smi) where it lists this process: the
    GPU-wide figure counts every process on the GPU, and under pytest-xdist or simulation other
    workers' ranks share it. Where this process is not listed (AMD, a PID namespace): the GPU-wide
    figure."""
    if iris.runtime.SELECTED == "cpu":
        return 0
    try:
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        listing = subprocess.run(query, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        listing = ""
    mine = [int(used) << 20 for pid, _, used in (line.partition(",") for line in listing.splitlines())
            if pid.strip() == str(os.getpid())]
    if mine:
        return sum(mine)
    free, total = torch.cuda.mem_get_info()
    return total - free


def _create_fill_close_on_rank(times, heap_bytes):
    """(memory use after a first context, the most seen while ``times`` more are made and closed): resident,
    shared-memory resident, iris segments mapped, device memory used."""
    import gc

    def create_fill_close(i):
        ctx = iris.iris(heap_bytes)
        filled = ctx.full((heap_bytes // 4,), i, dtype=torch.int32)
        ctx.barrier()
        ctx.ccl  # noqa: B018  (the collectives and fused ops exist: their back-references must not pin the heap)
        ctx.ops  # noqa: B018
        ctx.close()
        del ctx, filled
        # the driver's figure every tenth context (asking it takes a while); a leak of any context adds up
        return (*_memory_use(), _device_memory_used() if i % 10 in (0, 9) else 0)

    gc.disable()  # the property: close() alone frees the heap, no collector pass needed
    try:
        first = create_fill_close(0)  # the first context also sets up the runtime (on a GPU: its context, kernels)
        peak = first
        for i in range(1, times):
            peak = tuple(max(a, b) for a, b in zip(peak, create_fill_close(i)))
        return first, peak
    finally:
        gc.enable()


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_closed_contexts_free_their_heaps_without_the_garbage_collector(ranks):
    heap = 64 << 20
    for rank, (first, peak) in enumerate(ranks.run(_create_fill_close_on_rank, 100, heap)):
        rss, shmem, _, device = (b - a for a, b in zip(first, peak))
        # At most the context being closed: its own heap and its peer's stay mapped until close(); 100 heaps
        # kept would be 6.4 GiB. Device memory: this process's (or, where the driver does not list it, the GPU's).
        assert peak[2] <= 2, f"rank {rank}: {peak[2]} iris segments mapped at once"
        assert shmem <= 3 * heap, f"rank {rank}: shared memory resident grew by {shmem >> 20} MiB"
        assert rss <= 4 * heap, f"rank {rank}: RSS grew by {rss >> 20} MiB"
        assert device <= 4 * heap, f"rank {rank}: device memory in use grew by {device >> 20} MiB"


def _job_on_rank():
    return os.environ["IRIS_JOB_ID"]


def _huge_heap_on_rank():
    with pytest.raises(MemoryError) as error:
        iris.iris(1 << 50)
    # the refusal leaves nothing behind: the next heap and the next kernel launch work (a failed cudaMalloc left
    # its error for the next launch's check to report as an out-of-memory of its own)
    ctx = iris.iris(1 << 20)
    ones = ctx.zeros(4).add_(1)
    assert ones.sum().item() == 4
    ctx.close()
    return str(error.value)


@pytest.mark.parametrize("ranks", [2], indirect=True)
def test_a_heap_too_large_names_heap_size_and_leaves_no_segment(ranks):
    job = ranks.run(_job_on_rank)[0]
    for message in ranks.run(_huge_heap_on_rank):
        # what the machine has: /dev/shm on the CPU backend, the device's free memory on a GPU
        has = "/dev/shm" if iris.runtime.SELECTED == "cpu" else "bytes free"
        assert "heap_size=1125899906842624" in message and has in message, message
    assert _job_segments(job) == []


_DIES_IN_SETUP = """
import sys
from iris.runtime import shm
segment = shm.create_segment(sys.argv[1], 4096)
print("created", flush=True)
import os
os._exit(1)  # as a rank killed mid-setup: the name stays, no one holds it
"""


def _segment_of_a_dead_process(name: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _DIES_IN_SETUP, name], capture_output=True, text=True, timeout=120)
    assert "created" in proc.stdout, proc.stdout + proc.stderr
    assert os.path.exists(f"/dev/shm{name}")


def _swept_by(sweep, name: str, attempts: int = 5) -> str:
    """Leave a dead process's segment ``name``, run ``sweep`` (which returns what it reports), return the report.

    Every heap made on the machine sweeps too (under pytest-xdist, other workers make heaps all the
    time): where another sweep got there first, try again, so that ``sweep`` is the one seen removing it."""
    for _ in range(attempts):
        _segment_of_a_dead_process(name)
        report = sweep()
        if f"/dev/shm{name}" in report:
            return report
        assert not os.path.exists(f"/dev/shm{name}"), f"the sweep kept a dead process's segment: {report}"
    raise AssertionError(f"another sweep removed {name} first {attempts} times running")


def test_stale_segments_are_removed_and_live_ones_kept():
    stale, live = f"/{shm.SEGMENT_PREFIX}teststale_x_0", f"/{shm.SEGMENT_PREFIX}testlive_x_0"
    held = shm.create_segment(live, 4096)
    try:
        _swept_by(lambda: "\n".join(shm.remove_stale_segments()), stale)
        assert not os.path.exists(f"/dev/shm{stale}")
        assert os.path.exists(f"/dev/shm{live}"), "a segment its creator still holds was removed"
    finally:
        held.unlink()
        held.close()


def _iris_cleanup() -> str:
    proc = subprocess.run([sys.executable, "-m", "iris", "cleanup"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_iris_cleanup_removes_what_dead_ranks_left():
    stale = f"/{shm.SEGMENT_PREFIX}testcleanup_x_1"
    report = _swept_by(_iris_cleanup, stale)
    assert "stale segment(s) removed" in report and not os.path.exists(f"/dev/shm{stale}")


@pytest.mark.slow
def test_a_segfaulting_rank_prints_its_python_stack_and_a_hint(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(textwrap.dedent("""
        import ctypes

        def touch_a_bad_address():
            ctypes.string_at(8)

        touch_a_bad_address()
    """))
    proc = subprocess.run([sys.executable, "-m", "iris", "run", "-n", "1", str(script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 128 + signal.SIGSEGV, proc.stdout + proc.stderr
    assert "Fatal Python error: Segmentation fault" in proc.stdout and "touch_a_bad_address" in proc.stdout, proc.stdout
    assert "IRIS_DEBUG=1" in proc.stdout, proc.stdout
