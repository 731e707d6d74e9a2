"""Rank and world from Slurm's variables (iris.runtime.distributed.launch), without Slurm.

The environments below are what Slurm 22.05 (Debian's slurm-wlm) gave a task of ``srun -n 2`` and the batch
script of ``sbatch -n 2`` on a one-node cluster (.ci/slurm.sh runs the real thing): a batch script sees
SLURM_PROCID=0 and the job's SLURM_NTASKS as well, but no SLURM_STEP_* variable, and must stay a world of one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from iris import config
from iris.runtime import distributed
from iris.runtime.distributed import Launch, expand_nodelist, expand_tasks_per_node, launch, slurm_port

# What a batch script of `sbatch -n 2` sees (the Slurm variables Iris declares).
BATCH_SCRIPT = {
    "SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "vm", "SLURM_NTASKS": "2", "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "2",
}


def srun_task(procid: int, tasks: int = 2, **more: str) -> dict[str, str]:
    """What task ``procid`` of ``srun -n TASKS`` on one node sees (job 1, step 0)."""
    return {
        **BATCH_SCRIPT, "SLURM_JOB_ID": "1", "SLURM_NTASKS": str(tasks), "SLURM_TASKS_PER_NODE": str(tasks),
        "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(procid), "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_STEP_NODELIST": "vm", "SLURM_STEP_TASKS_PER_NODE": str(tasks),
        **more,
    }


def two_nodes(procid: int) -> dict[str, str]:
    """Task ``procid`` of ``srun -N 2 --ntasks-per-node 4`` in job 4242, step 7, node-major."""
    return srun_task(procid, 8, SLURM_JOB_ID="4242", SLURM_STEP_ID="7", SLURM_LOCALID=str(procid % 4),
                     SLURM_NODEID=str(procid // 4), SLURM_STEP_NODELIST="gpu-node-[17-18]",
                     SLURM_STEP_TASKS_PER_NODE="4(x2)", SLURM_JOB_NODELIST="gpu-node-[17-18]")


def test_every_task_of_an_srun_step_is_one_rank_of_the_step():
    for procid in (0, 1):
        assert launch(srun_task(procid)) == Launch("slurm", 2, procid, procid, 2, "vm", slurm_port(1, 0))


def test_a_batch_script_without_srun_is_a_world_of_one():
    """SLURM_PROCID=0 and SLURM_NTASKS=2 there describe the job, not this process."""
    assert launch(BATCH_SCRIPT) == Launch("solo", 1)


def test_an_srun_step_of_one_task_is_a_world_of_one():
    """`srun -n 1 -c 2 python -m pytest conformance`: the driver starts its own ranks."""
    assert launch(srun_task(0, 1)) == Launch("solo", 1)


@pytest.mark.parametrize("step_id", ["4294967291", "4294967290", "4294967292", "batch", "extern"])
def test_the_batch_interactive_and_extern_steps_are_not_srun_steps(step_id):
    """Slurm numbers its special steps from 0xfffffff0 up (SLURM_BATCH_SCRIPT, SLURM_INTERACTIVE_STEP, ...)."""
    assert launch(srun_task(1, SLURM_STEP_ID=step_id)).launcher == "solo"


def test_ranks_on_two_nodes_take_the_local_id_the_node_s_task_count_and_the_first_host():
    launches = [launch(two_nodes(procid)) for procid in range(8)]
    assert [x.rank for x in launches] == list(range(8))
    assert {x.world_size for x in launches} == {8}
    assert [x.local_rank for x in launches] == [0, 1, 2, 3] * 2
    assert {x.local_world_size for x in launches} == {4}
    assert {(x.master_addr, x.master_port) for x in launches} == {("gpu-node-17", slurm_port(4242, 7))}


def test_the_local_world_is_this_node_s_share_of_an_uneven_step():
    env = srun_task(6, 7, SLURM_NODEID="2", SLURM_LOCALID="0", SLURM_STEP_NODELIST="n[1-3]",
                    SLURM_STEP_TASKS_PER_NODE="3,2(x2)")
    assert launch(env).local_world_size == 2
    del env["SLURM_STEP_TASKS_PER_NODE"]  # older releases: the job's count
    env["SLURM_TASKS_PER_NODE"] = "2(x3),1"
    assert launch(env).local_world_size == 2


def test_the_world_is_the_step_s_task_count_else_slurm_ntasks():
    env = srun_task(1, 4, SLURM_NTASKS="6")  # a heterogeneous step: SLURM_STEP_NUM_TASKS counts every part
    assert launch(env).world_size == 4
    del env["SLURM_STEP_NUM_TASKS"]
    assert launch(env).world_size == 6


def test_the_job_s_node_list_serves_where_the_step_s_is_unset():
    env = two_nodes(5)
    del env["SLURM_STEP_NODELIST"]
    assert launch(env).master_addr == "gpu-node-17"


@pytest.mark.parametrize("text, hosts", [
    ("vm", ["vm"]),
    ("node[01-03],other", ["node01", "node02", "node03", "other"]),
    ("gpu-node-[17-18]", ["gpu-node-17", "gpu-node-18"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("a[1,3-4]b,c", ["a1b", "a3b", "a4b", "c"]),
    ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
    ("x[5],y[2-3],z", ["x5", "y2", "y3", "z"]),
    ("10.0.0.[1-2]", ["10.0.0.1", "10.0.0.2"]),
])
def test_node_lists_expand_as_scontrol_show_hostnames(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text", ["", "n[1-", "n[3-1]", "n[a-b]", "n]1[", "a,,b", "n[]"])
def test_a_node_list_it_cannot_read_is_refused(text):
    with pytest.raises(ValueError, match="node list"):
        expand_nodelist(text)


@pytest.mark.parametrize("text, counts", [("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]),
                                          ("1,3,2(x2)", [1, 3, 2, 2])])
def test_tasks_per_node_expand(text, counts):
    assert expand_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "2(x)", "x", "2(3)", "-1"])
def test_tasks_per_node_it_cannot_read_are_refused(text):
    with pytest.raises(ValueError, match="tasks per node"):
        expand_tasks_per_node(text)


def test_explicit_rank_and_world_win_over_slurm_s():
    """torchrun or a recipe that exports RANK/WORLD_SIZE inside srun: those, with the step's rendezvous."""
    env = two_nodes(5) | {"RANK": "2", "WORLD_SIZE": "3"}
    got = launch(env)
    assert (got.launcher, got.rank, got.world_size) == ("env", 2, 3)
    assert (got.master_addr, got.master_port) == ("gpu-node-17", slurm_port(4242, 7))
    env |= {"MASTER_ADDR": "head", "MASTER_PORT": "29511", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    assert launch(env) == Launch("env", 3, 2, 0, 1, "head", 29511)


def test_master_addr_and_port_override_the_step_s_each_on_its_own():
    assert launch(two_nodes(1) | {"MASTER_PORT": "29600"})[5:] == ("gpu-node-17", 29600)
    assert launch(two_nodes(1) | {"MASTER_ADDR": "10.1.2.3"})[5:] == ("10.1.2.3", slurm_port(4242, 7))


def test_torchrun_s_variables_without_slurm_are_unchanged():
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    assert launch(env) == Launch("env", 2, 1, 1, 2, "127.0.0.1", 29500)


def test_rank_and_world_without_a_rendezvous_are_no_launch_of_their_own():
    """As before Slurm was read: RANK/WORLD_SIZE alone, outside srun, start no process group."""
    assert launch({"RANK": "0", "WORLD_SIZE": "2"}).launcher == "solo"
    assert launch({"RANK": "0", "WORLD_SIZE": "2", "PMI_SIZE": "2"}).launcher == "mpi"


def test_srun_s_own_pmi_variables_leave_the_launch_to_slurm():
    """`srun --mpi=pmi2` (or a cluster's MpiDefault) sets PMI_SIZE = the step's tasks: same ranks, no mpi4py."""
    assert launch(srun_task(1, PMI_SIZE="2")).launcher == "slurm"
    assert launch(srun_task(1, PMIX_SIZE="2")).launcher == "slurm"


@pytest.mark.parametrize("variables", [{"OMPI_COMM_WORLD_SIZE": "8"}, {"OMPI_COMM_WORLD_SIZE": "2"},
                                       {"PMI_SIZE": "8", "MPI_LOCALNRANKS": "4"}, {"PMI_SIZE": "8"},
                                       {"MV2_COMM_WORLD_SIZE": "2"}])
def test_mpirun_inside_an_allocation_is_an_mpi_launch(variables):
    """mpirun starts its ranks from daemons srun started: the step's variables describe the daemons."""
    got = launch(srun_task(0, 2) | variables)
    assert got.launcher == "mpi" and got.world_size == int(next(iter(variables.values())))


def test_the_port_comes_from_the_job_and_step_below_the_ephemeral_range():
    ports = {slurm_port(job, step) for job in range(1000) for step in range(16)}
    assert len(ports) == 16000, "steps of jobs that may share a node must not share a port"
    assert min(ports) >= 1024 and max(ports) < 32768, "Linux hands out 32768 and up to outgoing connections"
    assert slurm_port(1, 0) == slurm_port(1001, 16)


@pytest.mark.parametrize("name, value", [("SLURM_PROCID", "one"), ("SLURM_STEP_NUM_TASKS", "2x"),
                                         ("SLURM_PROCID", "2"), ("SLURM_LOCALID", "-1"), ("SLURM_JOB_ID", "j"),
                                         ("SLURM_STEP_NODELIST", "n[2-1]")])
def test_a_slurm_variable_that_makes_no_sense_is_refused_by_name(name, value):
    with pytest.raises(ValueError, match=name):
        launch(srun_task(1) | {name: value})


def test_launch_reads_the_declared_variables_of_this_process(monkeypatch):
    for name in config.TORCHRUN_VARIABLES + config.MPI_SIZE_VARIABLES + config.SLURM_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert launch() == Launch("solo", 1)
    assert distributed.job_world_size() == 1
    for name, value in two_nodes(6).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_UNRELATED", "x")
    assert config.launch_variables() == two_nodes(6)
    assert launch() == Launch("slurm", 8, 6, 2, 4, "gpu-node-17", slurm_port(4242, 7))
    assert distributed.job_world_size() == 8
    monkeypatch.delenv("SLURM_STEP_ID")  # the batch script of the same job
    assert distributed.job_world_size() == 1


def test_every_slurm_variable_read_is_declared_as_another_program_s():
    declared = {v.name: v.kind for v in config.VARIABLES}
    assert all(declared.get(name) == "outside" for name in config.SLURM_VARIABLES)


def test_init_distributed_starts_the_process_group_at_the_step_s_rendezvous(monkeypatch):
    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: False)
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda **kw: calls.append(kw))
    monkeypatch.setattr(distributed, "TorchCommunicator", lambda: "torch communicator")
    monkeypatch.setattr(distributed.atexit, "register", lambda fn: None)
    monkeypatch.setattr(config, "launch_variables", lambda: two_nodes(5))

    class Cpu:
        @staticmethod
        def device_for(rank):
            import torch
            return torch.device("cpu")

    assert distributed.init_distributed(Cpu) == "torch communicator"
    assert calls == [{"backend": "gloo", "rank": 5, "world_size": 8,
                      "init_method": f"tcp://gpu-node-17:{slurm_port(4242, 7)}"}]


CHILD = """
import sys

if __name__ == "__main__":
    from iris.runtime import distributed, get_backend

    comm = distributed.init_distributed(get_backend())
    print("ranks", comm.rank, comm.world_size, comm.all_gather_object(comm.rank), flush=True)
"""


@pytest.mark.slow  # two processes importing torch
def test_two_processes_with_an_srun_step_s_variables_meet_as_ranks_0_and_1(tmp_path):
    from iris.launch import free_port

    program = tmp_path / "child.py"
    program.write_text(textwrap.dedent(CHILD))
    base = {k: v for k, v in os.environ.items()
            if k not in config.TORCHRUN_VARIABLES + config.MPI_SIZE_VARIABLES + config.SLURM_VARIABLES}
    base["IRIS_BACKEND"] = "cpu"
    port = str(free_port())  # the step's own port might be taken on a shared machine
    children = [subprocess.Popen([sys.executable, str(program)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=base | srun_task(procid, MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
                for procid in (0, 1)]
    outputs = [child.communicate(timeout=120) for child in children]
    for procid, (child, (out, err)) in enumerate(zip(children, outputs)):
        assert child.returncode == 0, err
        assert f"ranks {procid} 2 [0, 1]" in out, out


@pytest.mark.parametrize("nodes,expected", [
    ((0, 0, 0, 0), [0, 1, 2, 3]),              # one node
    ((0, 0, 1, 1), [0, 1, 0, 1]),              # srun's block distribution
    ((0, 1, 0, 1), [0, 0, 1, 1]),              # srun -m cyclic: rank 2 is the second task of node 0
    ((1, 0, 1, 0, 1), [0, 0, 1, 1, 2]),        # uneven
])
def test_each_rank_takes_the_gpu_of_its_place_on_its_node_not_of_its_rank(nodes, expected):
    """Rank r's GPU index is its place among the ranks of its node (rank % GPUs gave two tasks of a node the same
    GPU under a cyclic distribution)."""
    assert [distributed.node_local_index(nodes, rank) for rank in range(len(nodes))] == expected

