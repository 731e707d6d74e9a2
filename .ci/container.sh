#!/usr/bin/env bash
# CI: an Iris image built and run without a registry or a container engine. debootstrap builds a Debian root
# filesystem (the host's release) in a temporary folder; docker/install.sh, the step list every Dockerfile and
# apptainer definition runs, installs Iris's dependencies in it (torch's CPU build); then, inside it (chroot) in a
# copy of this checkout: the README's Quick start command 1 and the conformance suite at 2 CPU ranks.
#   bash .ci/container.sh          (as root; about 7 minutes on 2 cores, most of it installing and building mpi4py)
# It all runs in private mount and PID namespaces (unshare): its mounts are never seen outside and go away with
# it, and no process it started outlives it. It unmounts them itself anyway, removes the folder on any exit
# (failure and Ctrl-C too), and checks that nothing under the folder is left mounted.
# Skips (exit 0, with the reason) where it is not root, has no namespaces, or cannot install debootstrap.
# Environment (each optional):
#   IRIS_CONTAINER_SUITE     the Debian release (default: the host's, bookworm on a host that is not Debian)
#   IRIS_CONTAINER_MIRROR    the Debian mirror (default http://deb.debian.org/debian)
#   IRIS_CONTAINER_TORCH     torch's version (default 2.13.0, the torch of .ci/run's Triton matrix; CPU build)
#   IRIS_CONTAINER_TRITON    triton's version (default 3.6.0, the GPU images' Triton and pyproject's oldest)
#   TORCH_INDEX_URL          where torch comes from (default https://download.pytorch.org/whl/cpu where that is
#                            reachable, else pip's own index and the host's PIP_FIND_LINKS)
#   IRIS_CONTAINER_SHM       the size of the root filesystem's own /dev/shm, a fresh tmpfs (default 8g)
#   TMPDIR                   where the temporary folder goes (default /tmp; a few GB, not mounted noexec)
# Nothing is kept between runs: downloads take seconds here, unpacking and installing take the time.
# The host's PIP_* settings (a CA bundle, local wheel folders) apply inside: files they name are copied in, folders
# bound read-only.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
script="$repo/.ci/container.sh"
started=$(date +%s)
say() { echo "== [container, $(( $(date +%s) - started )) s] $*"; }
skip() { echo "== container: SKIPPED: $*"; exit 0; }

if [ "${1:-}" != --inside ]; then
    # ---- outside: prerequisites, the temporary folder and its removal ----
    [ "$(uname -s)" = Linux ] || skip "not Linux"
    [ "$(id -u)" = 0 ] || skip "not root (debootstrap, chroot and mounts need root)"
    for tool in unshare chroot mount umount findmnt tar git; do
        command -v "$tool" >/dev/null || skip "no $tool on PATH"
    done
    unshare --mount --pid --fork --propagation private true 2>/dev/null \
        || skip "cannot make mount and PID namespaces here (unshare failed)"
    if ! command -v debootstrap >/dev/null; then
        say "installing debootstrap"
        if command -v apt-get >/dev/null && command -v flock >/dev/null; then
            export DEBIAN_FRONTEND=noninteractive
            flock /tmp/iris-apt.lock apt-get install -y -qq --no-install-recommends debootstrap >/dev/null 2>&1 \
                || { flock /tmp/iris-apt.lock apt-get update -qq >/dev/null 2>&1 \
                     && flock /tmp/iris-apt.lock apt-get install -y -qq --no-install-recommends debootstrap \
                        >/dev/null 2>&1; } || true
        fi
        command -v debootstrap >/dev/null || skip "debootstrap is missing and could not be installed with apt-get"
    fi

    work=$(mktemp -d "${TMPDIR:-/tmp}/iris-container.XXXXXX")
    inner=  # unshare's process id
    # shellcheck disable=SC2329  # run by the EXIT trap
    cleanup() {
        status=$?
        trap - EXIT INT TERM
        set +e  # every step of the clean-up runs, whatever fails
        if [ -n "$inner" ] && kill -0 "$inner" 2>/dev/null; then
            # Interrupted: the namespace's first process unmounts and exits on SIGTERM, and its end ends every
            # process inside; SIGKILL to unshare does the same without the unmounting (--kill-child).
            for first in $(ps -o pid= --ppid "$inner" 2>/dev/null); do kill -TERM "$first" 2>/dev/null || true; done
            for _ in $(seq 30); do kill -0 "$inner" 2>/dev/null || break; sleep 0.5; done
            kill -KILL "$inner" 2>/dev/null || true
            wait "$inner" 2>/dev/null || true
        fi
        # The mounts live in the namespace, so none should show here; unmount any that does before removing.
        findmnt -rn -o TARGET | grep -F "$work" | sort -r | while read -r target; do
            umount "$target" 2>/dev/null || umount -l "$target" || true
        done
        if findmnt -rn -o TARGET | grep -qF "$work"; then
            echo "== container: ERROR: still mounted under $work (left in place, not removed):" >&2
            findmnt -rn -o TARGET | grep -F "$work" >&2
            exit 1
        fi
        rm -rf "$work"
        if mount | grep -qF "$work"; then echo "== container: ERROR: a mount was left behind" >&2; status=1; fi
        say "removed $work; nothing left mounted; exit status $status"
        exit "$status"
    }
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    say "working in $work"
    # In the background so that this shell's traps run at once on a signal (a shell waits for a foreground
    # command to end before it runs one). --kill-child: if unshare dies, the namespace's first process dies too.
    unshare --mount --pid --fork --propagation private --kill-child -- bash "$script" --inside "$work" "$started" &
    inner=$!
    wait "$inner"
    exit  # with wait's status, through cleanup
fi

# ---- inside the namespaces (the first process of the PID namespace; mounts private to it) ----
work=$2
started=$3
root="$work/rootfs"
mounts=()  # what this process mounted, in order
unmount_all() {
    status=$?
    trap - EXIT INT TERM
    set +e
    for (( i = ${#mounts[@]} - 1; i >= 0; i-- )); do
        umount "${mounts[i]}" 2>/dev/null || umount -l "${mounts[i]}" 2>/dev/null || true
    done
    exit "$status"
}
trap unmount_all EXIT
trap 'exit 143' TERM  # from cleanup above (SIGINT is ignored in a background command; the first process of a
                      # PID namespace gets only the signals it handles)
bind() {  # bind SOURCE TARGET [ro]
    mkdir -p "$2"
    mount --bind "$1" "$2"
    mounts+=("$2")
    if [ "${3:-}" = ro ]; then mount -o remount,bind,ro "$2"; fi
}
phase() {  # phase NAME COMMAND...: runs it, prints its time
    local name=$1 t0
    shift
    t0=$(date +%s)
    say "$name"
    "$@" &  # waited for in the background: a SIGTERM ends this process at once, and the namespace with it
    wait $!
    say "$name: done in $(( $(date +%s) - t0 )) s"
}

# The host's Debian release (bookworm where the host is not Debian).
suite=${IRIS_CONTAINER_SUITE:-}
if [ -z "$suite" ] && [ -r /etc/os-release ]; then
    # shellcheck disable=SC1091
    suite=$(. /etc/os-release && if [ "${ID:-}" = debian ]; then echo "${VERSION_CODENAME:-}"; fi)
fi
suite=${suite:-bookworm}
mirror=${IRIS_CONTAINER_MIRROR:-http://deb.debian.org/debian}
mkdir -p "$root"
phase "debootstrap: Debian $suite (minbase) from $mirror" \
    debootstrap --variant=minbase "$suite" "$root" "$mirror"

# The running system: /proc of this PID namespace, /sys, the host's /dev with a /dev/shm of its own (the CPU
# backend's heaps are POSIX shared memory), name resolution for apt and pip.
mount -t proc proc "$root/proc"
mounts+=("$root/proc")
bind /sys "$root/sys" ro
bind /dev "$root/dev"
mount -t tmpfs -o "size=${IRIS_CONTAINER_SHM:-8g},mode=1777" shm "$root/dev/shm"
mounts+=("$root/dev/shm")
cat /etc/resolv.conf >"$root/etc/resolv.conf"
cat /etc/hosts >"$root/etc/hosts"

# The environment inside: nothing of the host's but its proxy and PIP_* settings.
environment=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
             TERM=dumb IRIS_BACKEND=cpu)
host_files="$root/usr/local/share/iris-host"  # files the host's PIP_* settings name (a CA bundle): copied here
for name in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY $(compgen -e | grep '^PIP_' || true); do
    [ -n "${!name:-}" ] || continue
    value=${!name}
    if [[ $name == PIP_* ]]; then  # paths the setting names: files copied in (apt may replace the original's
        value=                     # place, e.g. the CA bundle), folders bound read-only at the same place
        for token in ${!name}; do
            path=${token#file://}
            if [[ $path == /* ]] && [ -d "$path" ]; then
                bind "$path" "$root$path" ro
            elif [[ $path == /* ]] && [ -f "$path" ]; then
                mkdir -p "$host_files"
                cp "$path" "$host_files/$name-$(basename "$path")"
                token=/usr/local/share/iris-host/$name-$(basename "$path")
            fi
            value="${value:+$value }$token"
        done
    fi
    environment+=("$name=$value")
done

# torch's CPU build: from PyTorch's CPU index where it answers, else from pip's index and the host's wheels.
if [ -z "${TORCH_INDEX_URL+set}" ]; then
    TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
    if ! python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)' \
            "$TORCH_INDEX_URL/torch/" >/dev/null 2>&1; then
        say "$TORCH_INDEX_URL does not answer: torch from pip's index and PIP_FIND_LINKS (${PIP_FIND_LINKS:-unset})"
        TORCH_INDEX_URL=
    fi
fi
environment+=("TORCH_VERSION=${IRIS_CONTAINER_TORCH:-2.13.0}" "TORCH_INDEX_URL=$TORCH_INDEX_URL"
              "TRITON_VERSION=${IRIS_CONTAINER_TRITON:-3.6.0}")
inside() { chroot "$root" /usr/bin/env -i "${environment[@]}" bash -c "$1"; }

# The checkout as git sees it (tracked and untracked files, not the ignored ones), copied: nothing inside writes
# to it.
mkdir -p "$root/workspace/iris"
copy_checkout() {
    git -C "$repo" ls-files -z --cached --others --exclude-standard \
        | tar -C "$repo" --null --ignore-failed-read -T - -cf - \
        | tar -C "$root/workspace/iris" -xf -
}
phase "copying the checkout to /workspace/iris" copy_checkout

pins="torch ${IRIS_CONTAINER_TORCH:-2.13.0}, triton ${IRIS_CONTAINER_TRITON:-3.6.0}"
phase "the step list: docker/install.sh cpu ($pins)" inside 'bash /workspace/iris/docker/install.sh cpu'
phase "README Quick start, command 1, at 2 CPU ranks" \
    inside 'cd /workspace/iris && . /opt/venv/bin/activate &&
            pip install -e . && iris run -n 2 --timeout 300 examples/01_store/example.py --validate'
phase "conformance suite at 2 CPU ranks" \
    inside 'cd /workspace/iris && . /opt/venv/bin/activate && python -m pytest conformance -q --ranks 2'
say "passed: the image's step list, the Quick start and the conformance suite in Debian $suite"
