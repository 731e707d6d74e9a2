#!/usr/bin/env bash
# Build the Iris Apptainer image from the repository root: apptainer/build.sh [cuda|rocm] [apptainer build options...]
#   apptainer/build.sh                 -> iris.sif       from apptainer/iris.def
#   apptainer/build.sh rocm            -> iris-rocm.sif  from apptainer/iris-rocm.def
# Where building needs no root on your cluster, add --fakeroot (or set IRIS_SIF for another output path).
set -euo pipefail
cd "$(dirname "$0")/.."  # %files paths are relative to the repository root
flavour=${1:-cuda}
[ $# -gt 0 ] && shift
case "$flavour" in
    cuda) def=apptainer/iris.def; sif=iris.sif ;;
    rocm) def=apptainer/iris-rocm.def; sif=iris-rocm.sif ;;
    *) echo "usage: $0 [cuda|rocm] [apptainer build options...]" >&2; exit 2 ;;
esac
exec apptainer build "$@" "${IRIS_SIF:-$sif}" "$def"
