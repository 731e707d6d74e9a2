#!/usr/bin/env bash
# A shell (or a command) in the Iris Apptainer image, with the GPUs and this checkout as the working directory:
#   apptainer/run.sh                            # iris.sif, interactive shell
#   apptainer/run.sh rocm                       # iris-rocm.sif
#   apptainer/run.sh cuda python -m pytest conformance -q --ranks 2
# The image holds a copy of Iris in /opt/iris; PYTHONPATH=$PWD makes Python use this checkout's instead.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-cuda}
[ $# -gt 0 ] && shift
case "$flavour" in
    cuda) gpus=--nv; sif=iris.sif ;;
    rocm) gpus=--rocm; sif=iris-rocm.sif ;;
    *) echo "usage: $0 [cuda|rocm] [command...]" >&2; exit 2 ;;
esac
exec apptainer exec "$gpus" --bind "$PWD" --pwd "$PWD" --env "PYTHONPATH=$PWD" "${IRIS_SIF:-$sif}" "${@:-bash}"
