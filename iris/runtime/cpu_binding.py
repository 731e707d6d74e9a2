"""Which CPUs each rank of ``iris run --cpu-bind`` may run on (Linux).

Why: a small collective's eager cost is its host thread's, which the scheduler may move or share. Each rank
gets an equal share of whole cores, ranks spread over NUMA nodes in blocks (as 8-GPU boards attach GPUs 0-3
to the first socket); the GPUs' own NUMA nodes are not read.

Example:
    >>> binding(3, available=range(8), nodes=[[0, 1, 2, 3], [4, 5, 6, 7]], core_of=lambda cpus: [[c] for c in cpus])
    [[0, 1], [2, 3], [4, 5, 6, 7]]
    >>> cpu_list([0, 1, 2, 5])
    '0-2,5'
"""

from __future__ import annotations

import glob
import os

SYS_NODES = "/sys/devices/system/node"
SYS_CPUS = "/sys/devices/system/cpu"


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` (the kernel's list format) as ``[0, 1, 2, 3, 8, 10, 11]``."""
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus += range(int(low), int(high or low) + 1)
    return cpus


def cpu_list(cpus) -> str:
    """The kernel's list format of ``cpus``: ``[0, 1, 2, 5]`` as ``"0-2,5"``."""
    runs, ordered = [], sorted(cpus)
    for cpu in ordered:
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(f"{low}" if low == high else f"{low}-{high}" for low, high in runs)


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return None


def numa_nodes(available, root: str = SYS_NODES) -> list[list[int]]:
    """The ``available`` CPUs grouped by NUMA node, in node order (one group where the kernel names none)."""
    groups = []
    for path in sorted(glob.glob(os.path.join(root, "node[0-9]*")), key=lambda p: int(p.rsplit("node", 1)[1])):
        text = _read(os.path.join(path, "cpulist"))
        cpus = sorted(set(parse_cpu_list(text)) & set(available)) if text else []
        if cpus:
            groups.append(cpus)
    covered = {cpu for group in groups for cpu in group}
    rest = sorted(set(available) - covered)
    return groups + [rest] if rest else groups or [sorted(available)]


def cores(cpus, root: str = SYS_CPUS) -> list[list[int]]:
    """``cpus`` grouped by physical core (a core's hardware threads together), ordered by their lowest CPU."""
    seen, found = set(), []
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        text = _read(os.path.join(root, f"cpu{cpu}", "topology", "thread_siblings_list"))
        core = sorted((set(parse_cpu_list(text)) if text else {cpu}) & set(cpus)) or [cpu]
        seen.update(core)
        found.append(core)
    return found


def binding(nprocs: int, available=None, nodes=None, core_of=None) -> list[list[int]]:
    """The CPUs of each of ``nprocs`` ranks on this machine.

    Args:
        available: the CPUs to share out (default: this process's affinity).
        nodes: ``available`` grouped by NUMA node (default: read from the kernel, :func:`numa_nodes`).
        core_of: groups a node's CPUs into cores (default: :func:`cores`, from the kernel).
    """
    if nprocs < 1:
        raise ValueError(f"{nprocs} ranks: need at least one")
    available = sorted(os.sched_getaffinity(0) if available is None else available)
    nodes = numa_nodes(available) if nodes is None else nodes
    core_of = cores if core_of is None else core_of
    node_of = [rank * len(nodes) // nprocs for rank in range(nprocs)]  # in blocks, the first ranks on node 0
    placed = []
    for rank, node_index in enumerate(node_of):
        ranks, i = node_of.count(node_index), rank - node_of.index(node_index)  # ranks on its node, its place
        node_cores = core_of(nodes[node_index])
        if len(node_cores) >= ranks:
            share = node_cores[i * len(node_cores) // ranks:(i + 1) * len(node_cores) // ranks]
        else:  # more ranks than cores: in turn
            share = [node_cores[i % len(node_cores)]]
        placed.append(sorted(cpu for core in share for cpu in core))
    return placed
