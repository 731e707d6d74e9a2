"""Every environment variable Iris reads or sets, in one place (no other module touches ``os.environ``).

:data:`VARIABLES` is the table the environment page is generated from. Values are read when asked for, not
cached, since a test may change one between contexts.

Example:
    >>> from iris import config
    >>> config.wait_timeout_s()
    10.0
"""

from __future__ import annotations

import os
from typing import NamedTuple


class Variable(NamedTuple):
    """One environment variable: ``name``, ``default`` ("" for none; a switch's ``1``, ``0`` or a phrase), ``meaning``
    and ``kind``."""

    name: str
    default: str
    meaning: str
    kind: str = "setting"


#: The kinds of variable, with their headings, in the environment page's order.
KINDS = {
    "switch": "Switches",
    "setting": "Settings",
    "launch": "Set by iris run and Iris's tools for the processes they start",
    "tests": "Tests, conformance suite and benchmarks",
    "outside": "Other programs' variables that Iris reads or sets",
}

VARIABLES: tuple[Variable, ...] = (
    Variable("IRIS_BACKEND", "what torch sees",
             "``cuda``, ``hip`` or ``cpu``: the backend, chosen when iris is imported (CPU where there is no GPU)"),
    Variable("IRIS_SIMULATION", "0",
             "several ranks per GPU on purpose (rank r on GPU r % device count), each rank's heap bases written to "
             "JSON", "switch"),
    Variable("IRIS_HEAP_BASES_PREFIX", "iris",
             "prefix of the heap-bases JSON files that ranks write in simulation (IRIS_SIMULATION), "
             "``<prefix>_rank_<r>_heap_bases.json``"),
    Variable("IRIS_DEBUG", "0",
             "every context starts in debug mode (bounded waits, checked remote accesses, cross-rank argument "
             "checks)", "switch"),
    Variable("IRIS_WAIT_TIMEOUT", "10", "seconds a wait may last in debug mode before it gives up"),
    Variable("IRIS_STALL_TIMEOUT", "600",
             "seconds a device wait may last outside debug mode before the rank ends, naming the wait, the peer "
             "and its last call (a stalled or missing rank); 0: unbounded"),
    Variable("IRIS_RECORD_ON_HOST", "1",
             "on GPUs, the record a bounded wait or checked access fills (debug mode, IRIS_STALL_TIMEOUT) is a page of "
             "host memory at one fixed address, mapped for the device: compiled kernels stay the same from process "
             "to process (Triton's cache hits) and the stall watchdog reads it with no GPU call (safe beside graph "
             "capture); 0: a device allocation", "switch"),
    Variable("IRIS_AGREEMENT_CHECK", "300",
             "seconds the first call of each distinct collective or fused op (its op, shapes, dtypes and settings) "
             "waits to compare that call with every rank's: ranks that disagree raise ValueError naming each "
             "rank's call, before any launch; 0: off (debug mode compares every call)"),
    Variable("IRIS_LOG_LEVEL", "WARNING", "level of the ``[Iris] [rank/world]`` log lines: DEBUG, INFO, WARNING or "
             "ERROR"),
    Variable("IRIS_NODE_MAP", "from the ranks' host names",
             "the node of each rank, e.g. ``0,0,1,1``; the ``ipc`` heap refuses ranks on several nodes"),
    Variable("IRIS_ALLOCATOR", "",
             "the heap's memory when ``allocator_type`` names none: ``vmem`` (the address range reserved, backed in "
             "chunks as allocations grow) or ``torch`` (backed up front); empty: the backend's default "
             "(``iris info`` says which)"),
    Variable("IRIS_HEAP", "ipc", "the heap provider: ``ipc`` (CUDA/HIP IPC, or shared memory on the CPU) or "
             "``shmem`` (NVSHMEM/rocSHMEM through torch's symmetric memory)"),
    Variable("IRIS_GRAPH_REPLAY", "1",
             "a repeated ``ctx.ccl``/``ctx.ops`` call replays its launches from a CUDA/HIP graph captured on its "
             "second call", "switch"),
    Variable("IRIS_NATIVE_REPLAY", "1",
             "(CUDA) that replay is found and launched by a small C module built on first use, not by Python",
             "switch"),
    Variable("IRIS_NATIVE_CACHE", "~/.cache/iris/native", "where IRIS_NATIVE_REPLAY's C module is built"),
    Variable("IRIS_DIRECT_LAUNCH", "0",
             "(CUDA) a repeated call of one kernel relaunches it by ``cuLaunchKernel`` with its arguments packed "
             "once, instead of replaying a graph (less host and GPU time per small call)", "switch"),
    Variable("IRIS_LL_PACK", "by size",
             "all_reduce's ``ll`` variant packs two 16-bit elements into each word: 1 always, 0 never; unset, past "
             "32768 elements (so ll takes 16-bit messages up to 512 KiB per rank); set it the same on every rank",
             "switch"),
    Variable("IRIS_TWO_SHOT_WRITES", "1",
             "all_reduce's two_shot of two members into a separate output, past ``Config.fused_bytes`` (at any size "
             "for members on two nodes), first writes each member's half of the input that the other reduces into "
             "the other's output, instead of each reading it (0: reads); set it the same on every rank", "switch"),
    Variable("IRIS_GEMM_TUNED", "0",
             "``iris.ops.matmul`` on a GPU splits each tile's K range in parts where the tiles are fewer than the SMs "
             "(decode shapes, M up to 128) and loads operands through TMA descriptors on NVIDIA; off until measured "
             "against cuBLAS (``benchmarks/gemm.py``)", "switch"),
    Variable("IRIS_GEMM_FIT_TILES", "0",
             "``iris.ops.matmul``'s autotuners try only the tiles whose pipeline fits the GPU's shared memory per "
             "program and, where none does (an MI300X's 64 KiB of LDS), smaller tiles or fewer stages, and so do the "
             "fused ops (a hand-set tile that does not fit is refused); matmul reads it when iris.ops is imported, "
             "the fused ops at each call; off until the GPU gate has run with it", "switch"),
    Variable("IRIS_GEMM_TIMINGS_ON_DISK", "0",
             "``iris.ops.matmul``'s autotuners keep their timings in Triton's cache on disk (Triton's "
             "``cache_results``), so each rank of a job and each later run on the machine takes the tile timed "
             "first instead of compiling and timing every candidate; read when iris.ops is imported; off until "
             "the GPU gate has run with it", "switch"),
    Variable("IRIS_CPU_BIND", "0", "``iris run`` gives each rank cores of its own, as ``--cpu-bind``", "switch"),
    Variable("IRIS_QUIET_AMD_OPTIONS", "0",
             "no warning when an AMD-only launch option (``waves_per_eu``, ``matrix_instr_nonkdim``, ``kpack``, "
             "...) is dropped on a target that does not know it (iris.runtime.launch_options)", "switch"),
    Variable("IRIS_CPU_CUDA", "1",
             "(CPU backend without a GPU) code written for CUDA runs on the host: ``device=\"cuda\"`` means the "
             "CPU, ``torch.cuda``'s device, stream, event and synchronize calls are served there and "
             "``init_process_group(backend=\"nccl\")`` runs on gloo (iris.runtime.cuda_on_cpu); ``0`` leaves "
             "torch as it is", "switch"),
    Variable("IRIS_CROSS_COMPILE", "",
             "CPU backend: also compile every launched kernel for these GPU targets, e.g. ``cuda:90,hip:gfx942`` "
             "(the cross-compile gate)"),
    Variable("IRIS_CROSS_COMPILE_CACHE", "~/.cache/iris/cross-compile",
             "where the cross-compile gate's compilations are cached"),
    Variable("IRIS_ENGINE_CACHE", "~/.cache/iris/engine",
             "where NVSHMEM's device library, cut to the calls of the path across nodes, is kept"),
    Variable("RANK", "", "the rank: set by ``iris run`` and the test harness, read from torchrun-style launchers "
             "(torchrun, the Slurm recipes); with ``WORLD_SIZE`` it wins over Slurm's and MPI's variables",
             "launch"),
    Variable("WORLD_SIZE", "", "the number of ranks, set and read as ``RANK``", "launch"),
    Variable("LOCAL_RANK", "", "the rank's index on its node, set by ``iris run`` and the test harness (as torchrun "
             "does) for programs that pick their GPU by it", "launch"),
    Variable("LOCAL_WORLD_SIZE", "", "the number of ranks on the node, set as ``LOCAL_RANK``", "launch"),
    Variable("MASTER_ADDR", "", "torch.distributed's rendezvous host, set and read as ``RANK``; in an srun step "
             "it wins over the step's first host", "launch"),
    Variable("MASTER_PORT", "", "torch.distributed's rendezvous port, set and read as ``RANK``; in an srun step "
             "it wins over the port derived from the job and step ids", "launch"),
    Variable("IRIS_JOB_ID", "", "set by ``iris run`` and the test harness: names one launch's heap segments",
             "launch"),
    Variable("IRIS_STACKS_ON_SIGUSR1", "", "set by ``iris run``: SIGUSR1 prints the rank's Python stacks", "launch"),
    Variable("PYTHONUNBUFFERED", "", "set to ``1`` by ``iris run``: each rank's lines reach the launcher as they are "
             "printed", "launch"),
    Variable("PYTHONFAULTHANDLER", "", "set to ``1`` by ``iris run``: a rank that crashes (segmentation fault) "
             "prints its Python stack", "launch"),
    Variable("IRIS_COMPILE_TARGET", "", "set by the cross-compile gate in its workers: the target they compile for",
             "launch"),
    Variable("PYTHONPATH", "", "set by the cross-compile gate for its workers: the module path of the process "
             "that launches the kernels, so that they import the kernels' modules", "launch"),
    Variable("IRIS_TEST_TIMEOUT", "300", "tests: seconds a test's rank may take before the test fails (180 in the "
             "conformance suite)", "tests"),
    Variable("IRIS_TEST_WORLDS", "2", "tests: the world sizes of the ``ranks`` fixture, e.g. ``2,4`` (the 4-rank "
             "repeats: a core per rank, or simulation on one GPU)", "tests"),
    Variable("IRIS_FAILURE_LOG", "",
             "tests: a file where each failing test is named as it fails (``iris.testing.failure_log``)", "tests"),
    Variable("IRIS_CONFORMANCE_PROFILE", "smoke",
             "conformance suite: the hypothesis profile, ``smoke``, ``ci``, ``dev`` or ``thorough`` (read by "
             "conformance/; ``--hypothesis-profile`` wins)", "tests"),
    Variable("IRIS_COMMIT", "", "benchmarks: the commit written into the result CSVs where the tree's .git is "
             "stale or absent (read by benchmarks/)", "tests"),
    Variable("CC", "cc, else gcc", "the C compiler that builds the replay's C module", "outside"),
    Variable("NVSHMEM_SYMMETRIC_SIZE", "heap size + 1/8 + 256 MiB",
             "NVSHMEM's own heap; the ``shmem`` heap provider sets it when unset, to hold Iris's heap", "outside"),
    Variable("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "",
             "CUDA MPS's share of a GPU per process; read by the ``shmem`` heap provider", "outside"),
    Variable("TRITON_INTERPRET", "", "Triton's own switch; the CPU backend sets it to ``1``", "outside"),
    Variable("OMPI_COMM_WORLD_SIZE", "", "Open MPI's world size: a job started by mpirun", "outside"),
    Variable("PMI_SIZE", "", "MPICH's (and srun's PMI) world size: a job started by mpirun or srun", "outside"),
    Variable("PMIX_SIZE", "", "PMIx's world size: a job started by a PMIx launcher", "outside"),
    Variable("MPI_LOCALNRANKS", "", "MPICH Hydra's local rank count: a job started by mpirun", "outside"),
    Variable("MV2_COMM_WORLD_SIZE", "", "MVAPICH2's world size: a job started by mpirun", "outside"),
    Variable("SLURM_STEP_ID", "", "set by srun in each task of a job step, never in a batch script (which sees "
             "``SLURM_PROCID=0`` and the job's ``SLURM_NTASKS`` too): a process with it, ``SLURM_PROCID`` and "
             "no ``RANK`` is one rank of the step (iris.runtime.distributed.launch)", "outside"),
    Variable("SLURM_PROCID", "", "Slurm's rank of the task: an srun task's rank", "outside"),
    Variable("SLURM_STEP_NUM_TASKS", "", "the tasks of the srun step: its world size", "outside"),
    Variable("SLURM_NTASKS", "", "the tasks of the job or step: the world size where ``SLURM_STEP_NUM_TASKS`` "
             "is unset", "outside"),
    Variable("SLURM_LOCALID", "", "the task's index on its node: an srun task's local rank", "outside"),
    Variable("SLURM_NODEID", "", "the index of the task's node in the step's node list", "outside"),
    Variable("SLURM_STEP_TASKS_PER_NODE", "", "the step's tasks on each node, e.g. ``4(x2),2``: the local world "
             "size (``SLURM_TASKS_PER_NODE`` where unset)", "outside"),
    Variable("SLURM_TASKS_PER_NODE", "", "the job's tasks on each node, read as ``SLURM_STEP_TASKS_PER_NODE``",
             "outside"),
    Variable("SLURM_STEP_NODELIST", "", "the step's hosts, e.g. ``node[01-03],other``: the first is the "
             "rendezvous host of an srun step (``SLURM_JOB_NODELIST`` where unset)", "outside"),
    Variable("SLURM_JOB_NODELIST", "", "the job's hosts, read as ``SLURM_STEP_NODELIST``", "outside"),
    Variable("SLURM_JOB_ID", "", "the job's id: with ``SLURM_STEP_ID`` it makes an srun step's rendezvous port",
             "outside"),
)

TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MPI_SIZE_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE")
SLURM_VARIABLES = ("SLURM_STEP_ID", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID",
                   "SLURM_NODEID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_STEP_NODELIST",
                   "SLURM_JOB_NODELIST", "SLURM_JOB_ID")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_BY_NAME = {variable.name: variable for variable in VARIABLES}


def text(name: str, default: str = "") -> str:
    """The variable ``name`` as set, else ``default``."""
    return os.environ.get(name, default)


def switch_default(name: str) -> bool | None:
    """The default of the switch ``name``: True, False, or None (the setting's own choice)."""
    return {"1": True, "0": False}.get(_BY_NAME[name].default)


def switch(name: str) -> bool | None:
    """The switch ``name``: 1, true, yes, on / 0, false, no, off (any case); unset or empty: its default.

    Raises:
        ValueError: any other value (a typo must not flip the switch).

    Example:
        >>> switch("IRIS_DEBUG")  # IRIS_DEBUG unset: its default, off
        False
        >>> switch("IRIS_DEBUG")  # IRIS_DEBUG=maybe
        Traceback (most recent call last):
        ValueError: IRIS_DEBUG='maybe' is not a switch: 1, true, yes or on turns it on, 0, false, no or off turns it
        off (any case); unset or empty, it is off
    """
    default = switch_default(name)
    value = text(name).strip().lower()
    if not value:
        return default
    if value in _TRUE or value in _FALSE:
        return value in _TRUE
    unset = "its own choice" if default is None else "on" if default else "off"
    raise ValueError(f"{name}={text(name)!r} is not a switch: {', '.join(_TRUE[:-1])} or {_TRUE[-1]} turns it on, "
                     f"{', '.join(_FALSE[:-1])} or {_FALSE[-1]} turns it off (any case); unset or empty, it is "
                     f"{unset}")


def check_switches() -> None:
    """Read every switch, so a bad word is refused before any work (``iris run`` calls it first).

    Raises:
        ValueError: the first switch set to a word it does not take (see :func:`switch`).
    """
    for variable in VARIABLES:
        if variable.kind == "switch":
            switch(variable.name)


def record_on_host() -> bool:
    """IRIS_RECORD_ON_HOST: the debug record is a fixed host page mapped for the GPU (see iris.host.debug)."""
    return switch("IRIS_RECORD_ON_HOST")


def gemm_tuned() -> bool:
    """IRIS_GEMM_TUNED: iris.ops.matmul takes its split-K and TMA kernel."""
    return switch("IRIS_GEMM_TUNED")


def gemm_timings_on_disk() -> bool:
    """IRIS_GEMM_TIMINGS_ON_DISK: iris.ops.matmul's autotuners keep their timings on disk."""
    return switch("IRIS_GEMM_TIMINGS_ON_DISK")


def gemm_fit_tiles() -> bool:
    """IRIS_GEMM_FIT_TILES: iris.ops.matmul's autotuners keep to tiles that fit the GPU's shared memory."""
    return switch("IRIS_GEMM_FIT_TILES")


def cpu_bind_requested() -> bool:
    """IRIS_CPU_BIND: ``iris run`` binds each rank to cores of its own."""
    return switch("IRIS_CPU_BIND")


def backend_request() -> str:
    """IRIS_BACKEND, lower case ("" when unset)."""
    return text("IRIS_BACKEND").strip().lower()


def interpreter_on() -> bool:
    """Whether Triton's interpreter runs the kernels of this process (TRITON_INTERPRET=1)."""
    return text("TRITON_INTERPRET") == "1"


def turn_interpreter_on() -> None:
    """Set TRITON_INTERPRET=1 (read by ``@triton.jit`` when a kernel is defined)."""
    os.environ["TRITON_INTERPRET"] = "1"


def compile_target() -> str:
    """IRIS_COMPILE_TARGET: in a cross-compile worker, its target ("cuda:90", "hip:gfx942"); else ""."""
    return text("IRIS_COMPILE_TARGET")


def cross_compile_targets() -> str:
    """IRIS_CROSS_COMPILE, e.g. "cuda:90,hip:gfx942" ("" when unset)."""
    return text("IRIS_CROSS_COMPILE")


def set_cross_compile_targets(spec: str) -> None:
    """Set IRIS_CROSS_COMPILE, for this process's rank processes to inherit."""
    os.environ["IRIS_CROSS_COMPILE"] = spec


def _cache(variable: str, name: str) -> str:
    """The directory ``variable`` names, else ``~/.cache/iris/<name>``."""
    return text(variable) or os.path.join(os.path.expanduser("~"), ".cache", "iris", name)


def cross_compile_cache() -> str:
    """IRIS_CROSS_COMPILE_CACHE, else ~/.cache/iris/cross-compile."""
    return _cache("IRIS_CROSS_COMPILE_CACHE", "cross-compile")


def c_compiler() -> str:
    """CC ("" when unset: cc or gcc from PATH)."""
    return text("CC")


def native_cache() -> str:
    """IRIS_NATIVE_CACHE, else ~/.cache/iris/native."""
    return _cache("IRIS_NATIVE_CACHE", "native")


def engine_cache() -> str:
    """IRIS_ENGINE_CACHE, else ~/.cache/iris/engine."""
    return _cache("IRIS_ENGINE_CACHE", "engine")


def quiet_amd_options() -> bool:
    """IRIS_QUIET_AMD_OPTIONS: AMD-only launch options are dropped off AMD without a warning."""
    return switch("IRIS_QUIET_AMD_OPTIONS")


def cpu_cuda() -> bool:
    """IRIS_CPU_CUDA: on the CPU backend without a GPU, ``torch.cuda``'s calls are served by the host."""
    return switch("IRIS_CPU_CUDA")


def debug_requested() -> bool:
    """IRIS_DEBUG: contexts start in debug mode."""
    return switch("IRIS_DEBUG")


def seconds(name: str, zero_means: str | None = None) -> float:
    """Variable ``name`` as a number of seconds (unset: its default in :data:`VARIABLES`); 0 allowed only where
    ``zero_means`` says what it does.

    Example:
        >>> seconds("IRIS_STALL_TIMEOUT", zero_means="unbounded")   # unset: the table's 600
        600.0

    Raises:
        ValueError: it is not a number of seconds, or negative (or 0 where 0 means nothing).
    """
    value_text = text(name, _BY_NAME[name].default)
    try:
        value = float(value_text)
    except ValueError:
        raise ValueError(f"{name}={value_text!r} must be a number of seconds") from None
    if value < 0 or (value == 0 and zero_means is None):
        allowed = f"0 ({zero_means}) or positive" if zero_means else "positive"
        raise ValueError(f"{name}={value_text!r} must be {allowed}")
    return value


def stall_timeout_s() -> float:
    """IRIS_STALL_TIMEOUT in seconds (default 600); 0: device waits are unbounded outside debug mode."""
    return seconds("IRIS_STALL_TIMEOUT", zero_means="unbounded")


def wait_timeout_s() -> float:
    """IRIS_WAIT_TIMEOUT in seconds (default 10)."""
    return seconds("IRIS_WAIT_TIMEOUT")


def agreement_check_s() -> float:
    """IRIS_AGREEMENT_CHECK in seconds (default 300): how long the first call of each distinct collective or fused
    op waits for every rank's description of its call; 0: the check is off."""
    return seconds("IRIS_AGREEMENT_CHECK", zero_means="off")


def log_level_name() -> str:
    return text("IRIS_LOG_LEVEL", "WARNING").strip().upper()


def node_map(world_size: int) -> tuple[int, ...] | None:
    """IRIS_NODE_MAP as one node number per rank (None when unset).

    Raises:
        ValueError: it is not ``world_size`` comma-separated non-negative integers.
    """
    value_text = text("IRIS_NODE_MAP").strip()
    if not value_text:
        return None
    parts = [part.strip() for part in value_text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise ValueError(f"IRIS_NODE_MAP={value_text!r}: give one node number per rank, e.g. 0,0,1,1")
    if len(parts) != world_size:
        raise ValueError(f"IRIS_NODE_MAP={value_text!r} names {len(parts)} ranks; this job has {world_size} ranks")
    return tuple(int(part) for part in parts)


def mps_share() -> float | None:
    """CUDA_MPS_ACTIVE_THREAD_PERCENTAGE as a number (None when unset or not a number)."""
    try:
        return float(text("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"))
    except ValueError:
        return None


def allocator_request() -> str:
    """IRIS_ALLOCATOR, lower case ("" when unset)."""
    return text("IRIS_ALLOCATOR").strip().lower()


def heap_request() -> str:
    """IRIS_HEAP as set ("" when unset)."""
    return text("IRIS_HEAP").strip()


def default_nvshmem_symmetric_size(heap_bytes: int) -> None:
    """Size NVSHMEM's symmetric heap for ``heap_bytes`` plus the engine's own, unless the user set it.

    Why: its 1 GiB default is smaller than Iris's default heap."""
    if "NVSHMEM_SYMMETRIC_SIZE" not in os.environ:
        os.environ["NVSHMEM_SYMMETRIC_SIZE"] = str(heap_bytes + heap_bytes // 8 + (256 << 20))


def graph_replay() -> bool:
    """IRIS_GRAPH_REPLAY (on unless 0): remembered calls replay from a captured graph."""
    return switch("IRIS_GRAPH_REPLAY")


def native_replay() -> bool:
    """IRIS_NATIVE_REPLAY (on unless 0): a remembered call's graph is launched from C, saving host time."""
    return switch("IRIS_NATIVE_REPLAY")


def direct_launch() -> bool:
    """IRIS_DIRECT_LAUNCH (off unless 1): a remembered call of one kernel is relaunched by cuLaunchKernel, its
    arguments packed once (iris.host.replay.direct), instead of a graph."""
    return switch("IRIS_DIRECT_LAUNCH")


def ll_pack() -> bool | None:
    """IRIS_LL_PACK: whether all_reduce's ll packs two 16-bit elements per word (None: by size)."""
    return switch("IRIS_LL_PACK")


def two_shot_writes() -> bool:
    """IRIS_TWO_SHOT_WRITES (on unless 0): a two-member two_shot moves halves by writes, not reads.

    Why: NVLink keeps its rate in both directions at once for writes, not for reads."""
    return switch("IRIS_TWO_SHOT_WRITES")


def simulation() -> bool:
    """IRIS_SIMULATION: several ranks may share a GPU on purpose."""
    return switch("IRIS_SIMULATION")


def heap_bases_prefix() -> str:
    return text("IRIS_HEAP_BASES_PREFIX", "iris")


def job_id() -> str:
    """IRIS_JOB_ID: shared by all ranks of one launch ("" outside ``iris run`` and the test harness)."""
    return text("IRIS_JOB_ID")


def stack_dumps_requested() -> bool:
    return text("IRIS_STACKS_ON_SIGUSR1") == "1"


def test_timeout_s() -> float:
    return float(text("IRIS_TEST_TIMEOUT", "300"))


def test_worlds() -> tuple[int, ...]:
    """IRIS_TEST_WORLDS: the world sizes tests/ runs its rank pools at (default 2).

    Example: ``IRIS_TEST_WORLDS=2,4 pytest tests -m ""`` repeats every pooled test at 4 ranks too.
    """
    value = text("IRIS_TEST_WORLDS", "2")
    try:
        worlds = tuple(int(part) for part in value.split(","))
    except ValueError:
        worlds = ()
    if not worlds or min(worlds) < 2:
        raise ValueError(f"IRIS_TEST_WORLDS={value!r}: give world sizes of 2 or more, separated by commas (e.g. 2,4)")
    return worlds


def failure_log() -> str:
    """IRIS_FAILURE_LOG: where the test suites name each failing test as it fails ("" for nowhere)."""
    return text("IRIS_FAILURE_LOG")


def launch_variables() -> dict[str, str]:
    """The launchers' variables that are set (torchrun's, MPI's sizes, Slurm's), by name, as text.

    iris.runtime.distributed.launch decides from them how this process was started.

    Example:
        >>> launch_variables()  # a task of `srun -n 2`
        {'SLURM_STEP_ID': '0', 'SLURM_PROCID': '1', 'SLURM_STEP_NUM_TASKS': '2', ...}
    """
    return {name: os.environ[name] for name in TORCHRUN_VARIABLES + MPI_SIZE_VARIABLES + SLURM_VARIABLES
            if name in os.environ}


def child_environment(drop: tuple[str, ...] = (), **values: str) -> dict[str, str]:
    """This process's environment with ``values`` set and ``drop`` removed, for a process it starts."""
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update(values)
    return env


def export(drop: tuple[str, ...] = (), **values: str) -> None:
    """Set ``values`` and remove ``drop`` in this process's own environment."""
    for name in drop:
        os.environ.pop(name, None)
    os.environ.update(values)
