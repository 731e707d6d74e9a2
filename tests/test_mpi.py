"""Bootstrap through a real MPI launch (mpirun + mpi4py), no torch.distributed involved."""

import os
import shutil
import subprocess
import textwrap

import pytest

from iris.testing.cross_compile import python_command  # the gate where IRIS_CROSS_COMPILE asks for it

pytestmark = pytest.mark.slow  # the slow tier (see pyproject.toml)

try:
    from mpi4py import MPI  # noqa: F401  (loads the MPI library too, not only the package)

    HAVE_MPI4PY = True
except (ImportError, RuntimeError):
    HAVE_MPI4PY = False

MPIRUN = shutil.which("mpirun") or shutil.which("mpiexec")

SCRIPT = """
import torch, triton, triton.language as tl
import iris

@triton.jit
def ring_store(buf, rank, world, heap_bases):
    iris.store(buf + rank, rank + 10, rank, (rank + 1) % world, heap_bases)

ctx = iris.iris(1 << 16)
rank, world = ctx.get_rank(), ctx.get_num_ranks()
buf = ctx.full((world,), -1, dtype=torch.int32)
token = ctx.broadcast("from-0" if rank == 0 else None)
ctx.barrier()
ring_store[(1,)](buf, rank, world, ctx.get_heap_bases())
ctx.barrier()
prev = (rank - 1) % world
assert buf[prev].item() == prev + 10, buf.tolist()
print(f"mpi rank {rank} of {world} ok {token}", flush=True)
ctx.close()
"""


NO_MPI = "needs an MPI launcher on PATH and a working mpi4py (pip install iris[mpi])"


@pytest.mark.skipif(not (MPIRUN and HAVE_MPI4PY), reason=NO_MPI)
def test_mpirun_bootstrap(tmp_path):
    script = tmp_path / "mpi_job.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    proc = subprocess.run([MPIRUN, "-n", "2", *python_command([str(script)])], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(2):
        assert f"mpi rank {rank} of 2 ok from-0" in proc.stdout
