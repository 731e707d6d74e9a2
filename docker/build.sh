#!/usr/bin/env bash
# Build the Iris image: docker/build.sh [cuda|rocm] [extra docker build arguments...]
#   docker/build.sh                    -> iris:cuda from docker/Dockerfile
#   docker/build.sh rocm               -> iris:rocm from docker/Dockerfile.rocm
#   docker/build.sh cuda --build-arg TORCH_VERSION=2.11.0 --build-arg TRITON_VERSION=3.6.0
set -euo pipefail
cd "$(dirname "$0")/.."
flavour=${1:-cuda}
[ $# -gt 0 ] && shift
case "$flavour" in
    cuda) dockerfile=docker/Dockerfile ;;
    rocm) dockerfile=docker/Dockerfile.rocm ;;
    *) echo "usage: $0 [cuda|rocm] [docker build arguments...]" >&2; exit 2 ;;
esac
exec docker build -f "$dockerfile" -t "${IRIS_IMAGE:-iris:$flavour}" "$@" .
