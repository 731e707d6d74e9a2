#!/usr/bin/env bash
# A shell (or a command) in the Iris image with every GPU and this checkout mounted at /workspace/iris:
#   docker/run.sh                                  # iris:cuda, interactive shell
#   docker/run.sh rocm                             # iris:rocm
#   docker/run.sh cuda tox -e gpu                  # any command instead of the shell
# --ipc=host: ranks share memory (CUDA/HIP IPC, the CPU backend's POSIX shared memory) beyond
# docker's 64 MB /dev/shm. The multicast-off variables are set in the images.
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-cuda}
[ $# -gt 0 ] && shift
case "$flavour" in
    cuda) gpus=(--gpus all) ;;
    rocm) gpus=(--device=/dev/kfd --device=/dev/dri --group-add video --security-opt seccomp=unconfined) ;;
    *) echo "usage: $0 [cuda|rocm] [command...]" >&2; exit 2 ;;
esac
tty=()
[ -t 0 ] && tty=(-it)
exec docker run --rm "${tty[@]}" "${gpus[@]}" --ipc=host --ulimit memlock=-1 \
    -v "$PWD:/workspace/iris" -w /workspace/iris "${IRIS_IMAGE:-iris:$flavour}" "${@:-bash}"
