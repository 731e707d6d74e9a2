"""Bootstrap: who am I, how many are we, and how do we exchange small objects.

``init_distributed`` takes, in order: an initialized torch.distributed group; else what :func:`launch` reads
from the launchers' variables: torchrun-style variables (RANK, WORLD_SIZE, ...; ``iris run`` sets them), a task
of an ``srun`` step (Slurm's variables), an MPI launch (through mpi4py), else a world of one.
"""

from __future__ import annotations

import atexit
import datetime
import itertools
import re
import socket
import time
from typing import Any, Mapping, NamedTuple

import torch.distributed as dist

from iris import config



class Communicator:
    """Host-side exchange between ranks (small objects only)."""

    rank: int = 0
    world_size: int = 1

    def all_gather_object(self, obj: Any) -> list:
        raise NotImplementedError

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        raise NotImplementedError

    def barrier(self, group=None) -> None:
        raise NotImplementedError

    def meet(self, timeout_s: float, what: str) -> None:
        """A barrier that gives up after ``timeout_s``: TimeoutError naming ``what`` and, where the transport can
        tell, the ranks that did not come. Example: ``comm.meet(10.0, "all_reduce's argument check")``."""
        raise NotImplementedError


class SoloCommunicator(Communicator):
    """A world of one: every collective is the identity."""

    def all_gather_object(self, obj):
        return [obj]

    def broadcast_object(self, obj, src=0):
        _check_src(src, 1)
        return obj

    def barrier(self, group=None):
        return None

    def meet(self, timeout_s, what):
        return None


_host_group = None


def _gloo_group():
    """A gloo group over all ranks for Iris's host traffic: NCCL refuses ranks sharing a GPU."""
    global _host_group
    if _host_group is None:
        _host_group = dist.new_group(backend="gloo")
    return _host_group


class TorchCommunicator(Communicator):
    """Exchange through torch.distributed (all ranks of the default group, over gloo)."""

    def __init__(self):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._group = _gloo_group()

    def all_gather_object(self, obj):
        out = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._group)
        return out

    def broadcast_object(self, obj, src=0):
        _check_src(src, self.world_size)
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self._group)
        return box[0]

    def barrier(self, group=None):
        dist.barrier(group=self._group if group is None else group)

    def meet(self, timeout_s, what):
        try:  # gloo's monitored barrier: rank 0 names every rank that did not answer in time
            dist.monitored_barrier(group=self._group, timeout=datetime.timedelta(seconds=timeout_s),
                                   wait_all_ranks=True)
        except RuntimeError as error:
            missing = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", str(error))
            who = f"rank {missing[1].strip()} did not arrive" if missing else "not every rank arrived"
            raise TimeoutError(f"{what}: {who} within {timeout_s:g} s") from None


class MpiCommunicator(Communicator):
    """Exchange through MPI_COMM_WORLD (mpi4py)."""

    def __init__(self):
        try:
            from mpi4py import MPI
        except ImportError as exc:  # pragma: no cover - depends on the machine
            raise RuntimeError(
                f"this process was started by an MPI launcher but mpi4py cannot be loaded ({exc}); "
                "run `pip install iris[mpi]` against an MPI library such as Open MPI or MPICH"
            ) from exc
        self._comm = MPI.COMM_WORLD
        self.rank = self._comm.Get_rank()
        self.world_size = self._comm.Get_size()

    def all_gather_object(self, obj):
        return self._comm.allgather(obj)

    def broadcast_object(self, obj, src=0):
        _check_src(src, self.world_size)
        return self._comm.bcast(obj, root=src)

    def barrier(self, group=None):
        if group is not None:
            raise ValueError("barrier(group=...) needs torch.distributed; this job was bootstrapped through MPI")
        self._comm.Barrier()

    def meet(self, timeout_s, what):
        request, deadline = self._comm.Ibarrier(), time.monotonic() + timeout_s
        while not request.Test():  # MPI cannot say who is missing, only that someone is
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: the ranks did not all arrive within {timeout_s:g} s")
            time.sleep(0.001)


def node_map(comm: Communicator) -> tuple[int, ...]:
    """Collective: each rank's node, by host name (IRIS_NODE_MAP overrides it); IPC reaches one node only.

    Example:
        >>> node_map(comm)      # two hosts, two ranks each
        (0, 0, 1, 1)
    """
    forced = config.node_map(comm.world_size)
    if forced is not None:
        return forced
    hosts = comm.all_gather_object(socket.gethostname())
    numbers = {}
    return tuple(numbers.setdefault(host, len(numbers)) for host in hosts)


def _check_src(src, world_size):
    if not isinstance(src, int) or not 0 <= src < world_size:
        raise ValueError(f"src={src!r} is not a rank of this world of {world_size}")


class Launch(NamedTuple):
    """How this process was started, as :func:`launch` reads it from the launchers' variables.

    ``launcher`` is ``env`` (RANK and WORLD_SIZE: torchrun, ``iris run``, the test harness, a recipe that
    exports them), ``slurm`` (a task of an srun step), ``mpi`` (mpirun; the rank is None until MPI says) or
    ``solo`` (a world of one). ``master_addr``/``master_port``: torch.distributed's rendezvous ("" and 0 where
    there is none).
    """

    launcher: str
    world_size: int
    rank: int | None = 0
    local_rank: int = 0
    local_world_size: int = 1
    master_addr: str = ""
    master_port: int = 0

    def init_method(self) -> str:
        """torch.distributed's ``init_method`` for the rendezvous, e.g. ``tcp://node01:15016``."""
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"


#: Slurm numbers its batch, interactive and extern steps above this (SLURM_MAX_NORMAL_STEP_ID in slurm.h).
_LAST_SRUN_STEP_ID = 0xFFFFFFF0
#: The MPI size variables that only mpirun/mpiexec set; srun's PMI plugins set PMI_SIZE or PMIX_SIZE at most.
_MPIRUN_ONLY = ("OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE")


def launch(variables: Mapping[str, str] | None = None) -> Launch:
    """How this process was started: its launcher, rank, world and rendezvous, from the launchers' variables.

    The rules, in order:

    1. RANK and WORLD_SIZE, where both are set, win (torchrun, ``iris run``, the test harness), with LOCAL_RANK
       and LOCAL_WORLD_SIZE (else the rank and world). The rendezvous is MASTER_ADDR and MASTER_PORT, each
       taken from the srun step (3.) where unset; outside an srun step, RANK and WORLD_SIZE without both of
       them are no launch of their own (as before Iris read Slurm's variables).
    2. A process started by mpirun or mpiexec (OMPI_COMM_WORLD_SIZE, MPI_LOCALNRANKS or MV2_COMM_WORLD_SIZE
       is set, or PMI_SIZE/PMIX_SIZE differs from the srun step's task count) is an MPI launch, even where it
       also sees an srun step's variables: inside an allocation, mpirun starts its ranks from daemons that
       srun started, and the step's variables it inherits describe those daemons, not the ranks.
    3. A task of an srun step: SLURM_STEP_ID (a normal step's id, below Slurm's batch, interactive and extern
       steps) and SLURM_PROCID set. A batch script, where a plain ``python prog.py`` also sees SLURM_PROCID=0
       and the job's SLURM_NTASKS, has no SLURM_STEP_ID: it stays a world of one, as does a step of one task
       (``srun -n 1 -c 2 python -m pytest conformance``, whose driver starts its own ranks). Rank SLURM_PROCID,
       world SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), local rank SLURM_LOCALID, local world this node's
       share of SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE; SLURM_NODEID picks the node); the
       rendezvous is the first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST) at :func:`slurm_port`
       of the job and step, MASTER_ADDR and MASTER_PORT winning where set. Tasks of ``srun --mpi=pmi2`` or
       ``--mpi=pmix`` (or of a cluster whose MpiDefault is one of them) also carry PMI_SIZE or PMIX_SIZE,
       equal to the step's task count, with the same ranks (srun's PMI rank is SLURM_PROCID): they are
       Slurm launches too, so Iris initializes torch.distributed itself and needs no mpi4py.
    4. Any MPI size variable: an MPI launch. 5. Else a world of one.

    Args:
        variables: the launchers' variables by name (default: this process's, config.launch_variables()).

    Raises:
        ValueError: a variable it reads makes no sense (not a number, a rank outside the world, a node list it
            cannot read), naming the variable.

    Example:
        >>> launch()  # a task of `srun -N 2 --ntasks-per-node 4`, job 4242, step 7
        Launch(launcher='slurm', world_size=8, rank=5, local_rank=1, local_world_size=4,
               master_addr='gpu-node-17', master_port=18879)
    """
    env = config.launch_variables() if variables is None else variables
    step = _srun_step(env)
    if "RANK" in env and "WORLD_SIZE" in env and (("MASTER_ADDR" in env and "MASTER_PORT" in env) or step):
        rank, world = _number(env, "RANK"), _number(env, "WORLD_SIZE", least=1)
        if rank >= world:
            raise ValueError(f"RANK={rank} is not a rank of WORLD_SIZE={world}")
        addr = env.get("MASTER_ADDR") or _first_host(env)
        port = _number(env, "MASTER_PORT") if "MASTER_PORT" in env else _step_port(env)
        return Launch("env", world, rank, _number(env, "LOCAL_RANK") if "LOCAL_RANK" in env else rank,
                      _number(env, "LOCAL_WORLD_SIZE", least=1) if "LOCAL_WORLD_SIZE" in env else world, addr, port)
    sizes = {name: _number(env, name, least=1) for name in config.MPI_SIZE_VARIABLES if name in env}
    if sizes and (not step or any(name in sizes for name in _MPIRUN_ONLY)
                  or any(size != _step_tasks(env) for size in sizes.values())):
        return Launch("mpi", next(iter(sizes.values())), None)
    if step and _step_tasks(env) > 1:
        world = _step_tasks(env)
        rank = _number(env, "SLURM_PROCID")
        if rank >= world:
            raise ValueError(f"SLURM_PROCID={rank} is not a rank of the step's {world} tasks")
        return Launch("slurm", world, rank, _number(env, "SLURM_LOCALID"), _local_world(env),
                      env.get("MASTER_ADDR") or _first_host(env),
                      _number(env, "MASTER_PORT") if "MASTER_PORT" in env else _step_port(env))
    return Launch("solo", 1)


def _number(env: Mapping[str, str], name: str, least: int = 0) -> int:
    text = env.get(name, "")
    if not text.strip().isdigit() or int(text) < least:
        raise ValueError(f"{name}={text!r}: expected a whole number of at least {least}")
    return int(text)


def _srun_step(env: Mapping[str, str]) -> bool:
    """Whether these are the variables of a task that srun started (not a batch script's, see :func:`launch`)."""
    step = env.get("SLURM_STEP_ID", "")
    return step.isdigit() and int(step) <= _LAST_SRUN_STEP_ID and "SLURM_PROCID" in env


def _step_tasks(env: Mapping[str, str]) -> int:
    name = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    return _number(env, name, least=1)


def _local_world(env: Mapping[str, str]) -> int:
    """The step's tasks on this node (SLURM_STEP_TASKS_PER_NODE's entry for SLURM_NODEID)."""
    name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in env else "SLURM_TASKS_PER_NODE"
    if name not in env:  # srun sets it; without it, one node is all there is to assume
        return _step_tasks(env)
    try:
        counts = expand_tasks_per_node(env[name])
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    node = _number(env, "SLURM_NODEID") if "SLURM_NODEID" in env else 0
    if node >= len(counts):
        raise ValueError(f"SLURM_NODEID={node} is not a node of {name}={env[name]!r}")
    return counts[node]


def _first_host(env: Mapping[str, str]) -> str:
    name = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in env else "SLURM_JOB_NODELIST"
    if name not in env:
        raise ValueError("an srun step without SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: set MASTER_ADDR")
    try:
        return expand_nodelist(env[name])[0]
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None


def _step_port(env: Mapping[str, str]) -> int:
    return slurm_port(_number(env, "SLURM_JOB_ID"), _number(env, "SLURM_STEP_ID"))


def slurm_port(job_id: int, step_id: int) -> int:
    """The rendezvous port of an srun step: 15000 + 16 * (job id % 1000) + step id % 16 (15000 to 30999).

    Concurrent steps of one job, and steps of jobs less than 1000 apart, get ports of their own; all stay
    below 32768, where Linux starts handing out ports to outgoing connections. MASTER_PORT overrides it.

    Example:
        >>> slurm_port(4242, 7)
        18879
    """
    return 15000 + 16 * (job_id % 1000) + step_id % 16


_RANGE = re.compile(r"(\d+)(?:-(\d+))?$")


def expand_nodelist(text: str) -> list[str]:
    """The hosts of a Slurm node list, in order, as ``scontrol show hostnames`` prints them.

    Commas outside brackets separate entries; each bracket holds numbers and ranges (a range keeps the width
    of its first number: ``[098-101]``), and several brackets in one entry multiply.

    Raises:
        ValueError: a list it cannot read (unbalanced or empty brackets, a range that runs backwards).

    Example:
        >>> expand_nodelist("node[01-03],other")
        ['node01', 'node02', 'node03', 'other']
    """
    entries, depth, start = [], 0, 0
    for i, char in enumerate(text + ","):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f"node list {text!r}: brackets do not pair")
        if char == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"node list {text!r}: a bracket is not closed")
    hosts = []
    for entry in entries:
        parts = re.split(r"\[([^\[\]]*)\]", entry)  # text, bracket, text, bracket, ..., text
        if not entry or any(c in part for part in parts[::2] for c in "[]"):
            raise ValueError(f"node list {text!r}: cannot read the entry {entry!r}")
        choices = [[part] if i % 2 == 0 else _bracket(text, part) for i, part in enumerate(parts)]
        hosts.extend("".join(pieces) for pieces in itertools.product(*choices))
    return hosts


def _bracket(text: str, inside: str) -> list[str]:
    values = []
    for item in inside.split(","):
        match = _RANGE.match(item)
        if not match:
            raise ValueError(f"node list {text!r}: cannot read [{inside}]")
        low, high = match[1], match[2] or match[1]
        if int(high) < int(low):
            raise ValueError(f"node list {text!r}: the range {item} runs backwards")
        values.extend(str(n).zfill(len(low)) for n in range(int(low), int(high) + 1))
    return values


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's tasks per node (SLURM_STEP_TASKS_PER_NODE), one count per node in node-list order.

    Example:
        >>> expand_tasks_per_node("2(x3),1")
        [2, 2, 2, 1]
    """
    counts = []
    for item in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item)
        if not match:
            raise ValueError(f"tasks per node {text!r}: cannot read {item!r} (expected N or N(xR))")
        counts.extend([int(match[1])] * int(match[2] or 1))
    return counts


def job_world_size() -> int:
    """How many ranks this job has, before any Iris context exists (to size a heap, say).

    WORLD_SIZE where set, else what :func:`launch` finds (an srun step's task count, an MPI launcher's size).

    Example:
        >>> ctx = iris.iris(heap_size=job_world_size() * (64 << 20))
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    variables = config.launch_variables()
    if "WORLD_SIZE" in variables:
        return _number(variables, "WORLD_SIZE", least=1)
    return launch(variables).world_size


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def node_local_index(nodes: tuple[int, ...], rank: int) -> int:
    """``rank``'s place among the ranks of its node (``nodes``: each rank's node, :func:`node_map`): the GPU it takes.

    Example:
        >>> node_local_index((0, 1, 0, 1), 2)    # srun -m cyclic: rank 2 is node 0's second task
        1
    """
    return sum(1 for other in range(rank) if nodes[other] == nodes[rank])


def init_distributed(backend, device_for_rank=None) -> Communicator:
    """Find or create the job's communicator (see the module docstring).

    Args:
        backend: the Iris backend, whose ``device_for`` places each rank.
        device_for_rank: callable(rank) -> torch.device, in place of ``backend.device_for``.

    Example:
        >>> comm = init_distributed(runtime.get_backend())
    """
    device_for_rank = device_for_rank or backend.device_for
    if dist.is_available() and dist.is_initialized():
        return TorchCommunicator()
    variables = config.launch_variables()
    launched = launch(variables)
    if launched.launcher in ("env", "slurm"):
        rank, world = launched.rank, launched.world_size
        # torchrun's agent hosts the store at MASTER_ADDR:MASTER_PORT: env:// joins it, tcp:// would start another.
        init = "env://" if "MASTER_ADDR" in variables and "MASTER_PORT" in variables else launched.init_method()
        # the GPU of the rank's place on its node (a cyclic srun distribution puts ranks 0 and 2 on one node)
        device = device_for_rank(launched.local_rank)
        local = launched.local_world_size
        shares_devices = len({device_for_rank(r) for r in range(local)}) < local
        if device.type == "cpu" or shares_devices:
            # NCCL refuses several ranks per GPU.
            dist.init_process_group(backend="gloo", rank=rank, world_size=world, init_method=init)
        else:
            dist.init_process_group(backend="cpu:gloo,cuda:nccl", rank=rank, world_size=world, device_id=device,
                                    init_method=init)
        # Ended before interpreter teardown, where gloo's threads can abort the process.
        atexit.register(_destroy_process_group)
        return TorchCommunicator()
    if launched.launcher == "mpi":
        return MpiCommunicator()
    return SoloCommunicator()
