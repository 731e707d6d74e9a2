"""apptainer/multinode.slurm gives every rank of a two-node job the right environment.

Slurm and apptainer are not installed here: small fake ``srun``, ``scontrol`` and ``apptainer``
executables stand in for the cluster. ``srun`` runs its command once per task with the SLURM_*
variables Slurm sets per task, ``scontrol show hostnames`` names two hosts, and ``apptainer exec``
records, instead of running the program, the environment and the command line the program would
get. What is tested is the script's logic: the batch script's own variables, how each task turns
its SLURM_* variables into RANK, WORLD_SIZE and LOCAL_RANK, and what reaches the container.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "apptainer" / "multinode.slurm"
HOSTS = ("gpu-node-17", "gpu-node-18")
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

FAKE_SCONTROL = f"""#!/usr/bin/env bash
# scontrol show hostnames NODELIST: one host per line
[ "$1 $2" = "show hostnames" ] && [ -n "$3" ] || {{ echo "fake scontrol: unexpected $*" >&2; exit 2; }}
printf '%s\\n' {' '.join(HOSTS)}
"""

FAKE_SRUN = """#!/usr/bin/env bash
# srun [OPTIONS] COMMAND...: COMMAND once per task, node-major, with Slurm's per-task variables
printf '%s\\n' "$@" > "$FAKE_OUT/srun-arguments"
while [ "$#" -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
per_node=$SLURM_NTASKS_PER_NODE
tasks=$((SLURM_JOB_NUM_NODES * per_node))
mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
status=0
for ((task = 0; task < tasks; task++)); do
    node=$((task / per_node))
    SLURM_PROCID=$task SLURM_LOCALID=$((task % per_node)) SLURM_NODEID=$node SLURM_NTASKS=$tasks \\
        SLURM_STEP_NUM_TASKS=$tasks SLURMD_NODENAME=${hosts[$node]} "$@" || status=$?
done
exit "$status"
"""

FAKE_APPTAINER = """#!/usr/bin/env bash
# apptainer exec [OPTIONS] IMAGE COMMAND...: record what COMMAND would see (environment, arguments)
[ "$1" = exec ] || { echo "fake apptainer: unexpected $1" >&2; exit 2; }
shift
while [ "$#" -gt 0 ]; do
    case $1 in
        --env) export "${2?}"; shift 2 ;;
        --bind|-B|--pwd|--home) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
record=$(mktemp "$FAKE_OUT/task.XXXXXX")
env -0 > "$record.env"
printf '%s\\0' "$@" > "$record.args"  # the image, then the command
[ "${RANK:-}" != "${FAKE_FAIL_RANK:-none}" ] || exit 7
"""


def _header() -> dict:
    """The #SBATCH options, {"--nodes": "2", "--exclusive": ""}; only those before the first command count."""
    options = {}
    for line in SCRIPT.read_text().splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break  # sbatch stops reading #SBATCH lines at the first command
        match = re.match(r"#SBATCH\s+(--[\w-]+)(?:[= ]\s*(\S+))?", stripped)
        if match:
            options[match.group(1)] = match.group(2) or ""
    return options


def _run(tmp_path, *args, env=None):
    """The script under bash as sbatch's batch step would run it; (result, [(environment, argv), ...])."""
    fake = tmp_path / "bin"
    out = tmp_path / "out"
    fake.mkdir()
    out.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN), ("apptainer", FAKE_APPTAINER)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    header = _header()
    nodes, per_node = int(header["--nodes"]), int(header["--ntasks-per-node"])
    batch = {
        "PATH": f"{fake}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(tmp_path),
        "FAKE_OUT": str(out),
        # What sbatch sets in the batch step (which is task 0 of node 0).
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "gpu-node-[17-18]",
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_NTASKS": str(nodes * per_node),
        "SLURM_NPROCS": str(nodes * per_node),
        "SLURM_NTASKS_PER_NODE": str(per_node),
        "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})",
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        **(env or {}),
    }
    result = subprocess.run(["bash", str(SCRIPT), *args], env=batch, cwd=tmp_path,
                            capture_output=True, text=True, timeout=60)
    tasks = []
    for record in sorted(out.glob("task.*.env")):
        pairs = [entry.split("=", 1) for entry in record.read_text().split("\0") if entry]
        argv = record.with_suffix(".args").read_text().split("\0")[:-1]
        tasks.append((dict(pairs), argv))
    return result, tasks


def test_bash_accepts_the_script():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_header_asks_for_two_nodes_of_eight_gpus_one_task_per_gpu():
    header = _header()
    assert header.get("--nodes") == "2", header
    assert header.get("--ntasks-per-node") == "8", header
    assert header.get("--gpus-per-node") == "8", header
    assert header["--ntasks-per-node"] == header["--gpus-per-node"], "one rank per GPU needs as many tasks as GPUs"
    assert "--exclusive" in header and "--time" in header and "--output" in header, header
    assert "--ntasks" not in header and "--gpus-per-task" not in header, "tasks must not be bound to one GPU"


def test_every_rank_gets_its_own_environment_and_the_default_program(tmp_path):
    result, tasks = _run(tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(tasks) == 16, f"{len(tasks)} tasks ran the program"
    ranks = sorted(int(task_env["RANK"]) for task_env, _ in tasks)
    assert ranks == list(range(16)), f"ranks {ranks}: each of 0..15 must appear once"
    for task_env, argv in tasks:
        rank = task_env["RANK"]
        assert rank == task_env["SLURM_PROCID"], "RANK must be the task's SLURM_PROCID"
        assert task_env["LOCAL_RANK"] == task_env["SLURM_LOCALID"] == str(int(rank) % 8), rank
        assert task_env["WORLD_SIZE"] == "16", rank
        assert task_env["MASTER_ADDR"] == HOSTS[0], rank
        assert task_env["MASTER_PORT"] == "29500", rank
        assert task_env["IRIS_HEAP"] == "shmem", rank
        assert task_env["NVSHMEM_REMOTE_TRANSPORT"] == "ibrc", rank
        assert task_env["PYTHONPATH"] == str(ROOT), rank
        for name, value in MULTICAST_OFF.items():
            assert task_env.get(name) == value, f"rank {rank}: {name}={task_env.get(name)}"
        assert argv == ["iris.sif", "python", "examples/01_store/example.py", "--validate"], argv
    srun_arguments = (tmp_path / "out" / "srun-arguments").read_text().split()
    assert not any(a.startswith(("--gpus-per-task", "--gpu-bind=map", "--gpu-bind=single")) for a in srun_arguments)
    assert "2 nodes, 16 tasks, heap shmem, transport ibrc" in result.stdout, result.stdout


def test_overrides_and_program_arguments_reach_every_rank(tmp_path):
    env = {"IRIS_SIF": "iris-test.sif", "IRIS_HEAP": "ipc", "IRIS_MASTER_PORT": "29611",
           "NVSHMEM_REMOTE_TRANSPORT": "ibgda", "NVSHMEM_IB_ENABLE_IBGDA": "1", "NVSHMEM_HCA_LIST": "mlx5_0:1,mlx5_3:1"}
    program = ["my_program.py", "--validate", "--label", "two words"]
    result, tasks = _run(tmp_path, *program, env=env)
    assert result.returncode == 0, result.stderr
    assert len(tasks) == 16
    for task_env, argv in tasks:
        assert argv == ["iris-test.sif", "python", *program], argv
        assert task_env["IRIS_HEAP"] == "ipc"
        assert task_env["MASTER_PORT"] == "29611"
        assert task_env["NVSHMEM_REMOTE_TRANSPORT"] == "ibgda"
        assert task_env["NVSHMEM_IB_ENABLE_IBGDA"] == "1"
        assert task_env["NVSHMEM_HCA_LIST"] == "mlx5_0:1,mlx5_3:1"
    assert "heap ipc, transport ibgda" in result.stdout, result.stdout


def test_a_failing_rank_fails_the_job(tmp_path):
    result, tasks = _run(tmp_path, env={"FAKE_FAIL_RANK": "11"})
    assert len(tasks) == 16
    assert result.returncode != 0, "the job must fail when one rank fails"
