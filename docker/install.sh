#!/usr/bin/env bash
# The one step list of every Iris image: the OS packages and the Python environment Iris needs, everything but
# Iris itself. docker/Dockerfile, docker/Dockerfile.rocm, apptainer/iris.def, apptainer/iris-rocm.def and
# .ci/container.sh (CI's Debian root filesystem) all run it; no other recipe names a package.
#   docker/install.sh cuda    an Ubuntu/Debian base (nvidia/cuda): Python, a venv at $IRIS_VENV, torch + triton
#                             from PyPI (the torch wheel carries its CUDA runtime)
#   docker/install.sh cpu     the same with torch's CPU build ($TORCH_INDEX_URL, default PyTorch's CPU index)
#   docker/install.sh rocm    a ROCm PyTorch base (rocm/pytorch): its Python, torch and Triton are kept
# Environment (each optional):
#   TORCH_VERSION, TRITON_VERSION   pins for cuda and cpu (default 2.11.0 and 3.6.0, what Iris ran with on H200s)
#   TORCH_INDEX_URL                 where torch comes from; empty: pip's own index (PyPI)
#   IRIS_VENV                       the virtual environment for cuda and cpu (default /opt/venv)
#   IRIS_PYPROJECT                  Iris's pyproject.toml (default: beside this folder), whose extras name the
#                                   Python tools: test, bench (matplotlib) and mpi (mpi4py)
# Run as root, from a shell or a RUN/%post line; apt and pip output is left on stdout.
set -euo pipefail
usage() { echo "usage: $0 cuda|cpu|rocm" >&2; exit 2; }
[ $# -eq 1 ] || usage
flavour=$1
here=$(cd "$(dirname "$0")" && pwd)
pyproject=${IRIS_PYPROJECT:-$here/../pyproject.toml}
torch_version=${TORCH_VERSION:-2.11.0}
triton_version=${TRITON_VERSION:-3.6.0}
venv=${IRIS_VENV:-/opt/venv}
case "$flavour" in
    cuda) torch_index=${TORCH_INDEX_URL:-} ;;
    cpu) torch_index=${TORCH_INDEX_URL-https://download.pytorch.org/whl/cpu} ;;  # set but empty: PyPI
    rocm) torch_index= ;;
    *) usage ;;
esac
[ -f "$pyproject" ] || { echo "install.sh: no pyproject.toml at $pyproject (set IRIS_PYPROJECT)" >&2; exit 2; }
export DEBIAN_FRONTEND=noninteractive
step() { echo "== docker/install.sh $flavour, $SECONDS s: $*"; }

# MPICH with its compiler wrapper and headers: mpi4py is built against it below.
packages=(mpich libmpich-dev)
if [ "$flavour" != rocm ]; then
    # Python with its headers and venv, and a C compiler: Triton builds its launcher stubs at run time and
    # Iris its replay helper (iris/host/replay/native.c). The ROCm base image has all of these.
    packages=(python3 python3-dev python3-venv build-essential git "${packages[@]}")
fi
step "OS packages: ${packages[*]}"
apt-get update
apt-get install -y --no-install-recommends "${packages[@]}"
rm -rf /var/lib/apt/lists/*

if [ "$flavour" != rocm ]; then
    step "virtual environment $venv"
    python3 -m venv "$venv"
    # shellcheck disable=SC1091
    . "$venv/bin/activate"
    python3 -m pip install --upgrade pip
    index=()
    [ -z "$torch_index" ] || index=(--index-url "$torch_index")
    step "torch==$torch_version from ${torch_index:-the default index}, then triton==$triton_version"
    python3 -m pip install "${index[@]}" "torch==$torch_version"
    # Again beside triton and numpy, so that pip checks the pair against torch's own requirements.
    python3 -m pip install "torch==$torch_version" "triton==$triton_version" numpy
fi

# The Python tools come from pyproject.toml's extras: the test tools, matplotlib for the benchmarks' plots, mpi4py.
python3 -c 'import tomllib' 2>/dev/null || python3 -m pip install tomli  # Python < 3.11
extras() {
    python3 - "$pyproject" "$@" <<'EOF'
import sys
try:
    import tomllib
except ImportError:
    import tomli as tomllib
with open(sys.argv[1], "rb") as f:
    extras = tomllib.load(f)["project"]["optional-dependencies"]
print("\n".join(requirement for name in sys.argv[2:] for requirement in extras[name]))
EOF
}
tools=$(extras test bench)
mpi=$(extras mpi)
step "test and benchmark tools: $(echo "$tools" | tr '\n' ' ')"
# shellcheck disable=SC2086  # one requirement a line, none with spaces
python3 -m pip install $tools
# The PyPI mpi4py wheel looks for libmpi.so.12, which Debian/Ubuntu's MPICH names libmpich.so.12: build it.
step "$mpi built from source against MPICH"
# shellcheck disable=SC2086
python3 -m pip install --no-binary mpi4py $mpi

python3 - "$flavour" <<'EOF'
import sys
import mpi4py
import torch
import triton
if sys.argv[1] == "rocm":
    assert torch.version.hip, "not a ROCm torch"
print("== docker/install.sh", sys.argv[1] + ": done:", "torch", torch.__version__, "triton", triton.__version__,
      "mpi4py", mpi4py.__version__)
EOF
