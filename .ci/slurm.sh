#!/usr/bin/env bash
# Iris under a real, one-node Slurm (slurm-wlm and munge from Debian), the slow CI step:
#   bash .ci/slurm.sh [PYTHON | VENV]      # default: the active environment's python
# It installs slurm-wlm and munge where missing, starts munged, slurmctld and slurmd for this host as
# background daemons (no systemd, no cgroup plugins: proctrack/linuxproc, task/none), waits until the node
# is idle, then, with the given Python environment:
#   1. `srun -n 2` of a probe: Iris must read ranks 0 and 1 of 2 from srun's variables; then an sbatch job of
#      2 tasks whose batch script must be a world of one (a plain `python`, no srun) while `srun` inside it
#      starts ranks 0 and 1 of 2;
#   2. `srun -n 2 python examples/01_store/example.py --validate`: the Quick start's program, as one world of
#      two ranks that take rank and world from srun's variables (no other launcher);
#   3. the 2-rank conformance smoke, in two parts: the suite's pytest driver starts and supervises its own
#      rank processes, so it cannot run one rank per srun task. `srun -n 2` runs examples/13_ccl --validate
#      (every collective, one rank per task), and `srun -n 1 -c 2` runs `pytest conformance --ranks 2`
#      (profile smoke) inside one Slurm step.
# Every srun has a time limit. On exit the jobs are cancelled, the daemons stopped and their state removed,
# so it can run again at once; on a failure the daemons' logs are tailed. Skips (exit 0) where it is not
# root or where Slurm is missing and apt-get is unavailable.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
say() { echo "== slurm [$(( $(date +%s) - started )) s] $*"; }

if [ "$(id -u)" != 0 ]; then
    echo "slurm: skipped: starting slurmd and munged needs root (this is uid $(id -u))"
    exit 0
fi
# The Python environment: an interpreter, a virtual environment's directory, or the active one.
if [ "$#" -gt 1 ]; then
    echo "usage: bash .ci/slurm.sh [PYTHON | VENV]" >&2
    exit 2
fi
wanted=${1:-python}
if [ -d "$wanted" ]; then
    wanted="$wanted/bin/python"
fi
if ! python=$(command -v "$wanted"); then
    echo "slurm: no Python interpreter at '$wanted'" >&2
    exit 2
fi
python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python")  # absolute: srun's tasks run it as given

have_slurm() { command -v slurmctld && command -v slurmd && command -v srun && command -v munged; } >/dev/null
if ! have_slurm; then
    if ! command -v apt-get >/dev/null; then
        echo "slurm: skipped: slurm-wlm and munge are not installed and apt-get is unavailable"
        exit 0
    fi
    say "installing slurm-wlm and munge from Debian"
    # Another job may run apt-get at the same time: one at a time, through the same lock.
    install() {
        DEBIAN_FRONTEND=noninteractive flock /tmp/iris-apt.lock apt-get install -y -qq --no-install-recommends \
            slurm-wlm munge >/dev/null
    }
    install || { flock /tmp/iris-apt.lock apt-get update -qq && install; } || {
        echo "slurm: FAILED: apt-get could not install slurm-wlm and munge" >&2
        exit 1
    }
fi
say "$(slurmctld -V), $(munged --version 2>&1 | head -n 1), python $python"

daemons=()  # pids of munged, slurmctld, slurmd (started here, in the foreground of a background job)

logs() {
    local log
    for log in "$state"/munge/munged.log "$state"/slurmctld.log "$state"/slurmd.log; do
        [ -f "$log" ] || continue
        echo "---- last lines of $log"
        tail -n 40 "$log"
    done
}

finish() {
    local status=$?
    set +e
    if [ -n "${SLURM_CONF:-}" ] && [ "${#daemons[@]}" -ge 2 ]; then
        scancel --quiet --full --user=root 2>/dev/null
        for _ in $(seq 20); do  # the steps' processes end before slurmd goes
            [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
            sleep 0.5
        done
    fi
    if [ "$status" != 0 ]; then
        echo "slurm: FAILED (exit $status)" >&2
        logs >&2
    fi
    local pid
    for pid in "${daemons[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in "${daemons[@]}"; do
        wait "$pid" 2>/dev/null
    done
    rm -rf "$state"
    say "daemons stopped, state removed"
    exit "$status"
}
state=$(mktemp -d /tmp/iris-slurm.XXXXXX)  # every file of this cluster: removed on exit
trap finish EXIT
trap 'exit 130' INT TERM
chmod 755 "$state"
mkdir -m 700 "$state/munge"
mkdir -m 755 "$state/ctld" "$state/spool"

free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'; }

# munge: a key of our own and its own socket, beside any munged of the system.
dd if=/dev/urandom of="$state/munge/munge.key" bs=1024 count=1 status=none
chmod 400 "$state/munge/munge.key"
munged --foreground --force --key-file="$state/munge/munge.key" --socket="$state/munge/munge.socket" \
    --pid-file="$state/munge/munged.pid" --seed-file="$state/munge/munged.seed" \
    --log-file="$state/munge/munged.log" >>"$state/munge/munged.log" 2>&1 &
daemons+=("$!")

# slurm.conf for this host: slurmd finds its node by the short host name.
node=$(hostname -s)
cpus=$(nproc)
memory_mb=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.9 }' /proc/meminfo)
address=$(getent hosts "$node" | awk '{ print $1; exit }')
address=${address:-127.0.0.1}
export SLURM_CONF="$state/slurm.conf"
cat >"$SLURM_CONF" <<EOF
ClusterName=iris-ci
# Iris derives an srun step's rendezvous port from the job id: clusters started at once on one host (two CI
# runs) start their job ids apart.
FirstJobId=$(( RANDOM % 1000 + 1 ))
SlurmctldHost=$node($address)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$state/munge/munge.socket
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
ReturnToService=2
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/spool
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
NodeName=$node NodeAddr=$address CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=ci Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF

for _ in $(seq 50); do  # munged makes its socket
    [ -S "$state/munge/munge.socket" ] && break
    sleep 0.1
done
say "munged up; starting slurmctld and slurmd for node $node ($address, $cpus CPUs, $memory_mb MB)"
slurmctld -D -i -f "$SLURM_CONF" >>"$state/slurmctld.log" 2>&1 &
daemons+=("$!")
slurmd -D -f "$SLURM_CONF" >>"$state/slurmd.log" 2>&1 &
daemons+=("$!")

deadline=$(( $(date +%s) + 60 ))
until [ "$(sinfo -h -N -n "$node" -o %t 2>/dev/null)" = idle ]; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
        echo "slurm: node $node did not become idle within 60 s:" >&2
        sinfo -N -l >&2 || true
        scontrol show node "$node" >&2 || true
        exit 1
    fi
    sleep 1
done
say "node $node idle"

# Each srun: a time limit of its own (-t, minutes) and one from outside, in case srun itself hangs; a rank that
# fails ends the step (--kill-on-bad-exit). --overcommit: a 1-CPU runner still takes 2 tasks.
run() {  # run SECONDS SRUN-ARGUMENTS...
    local seconds=$1
    shift
    timeout -k 15 "$seconds" srun --kill-on-bad-exit=1 --overcommit -t "$(( (seconds + 59) / 60 ))" "$@"
}
# What Iris reads from the launchers' variables, one line per process.
probe=(-c 'from iris.runtime.distributed import launch; x = launch(); print(f"iris: {x.launcher} rank {x.rank} of {x.world_size}")')

say "srun -n 2: the ranks Iris reads"
out=$(run 120 -n 2 "$python" "${probe[@]}")
echo "$out"
[ "$(sort <<<"$out")" = $'iris: slurm rank 0 of 2\niris: slurm rank 1 of 2' ] || {
    echo "slurm: the two tasks of srun -n 2 must be ranks 0 and 1 of 2" >&2
    exit 1
}

say "sbatch -n 2: a plain python in the batch script is a world of one, srun inside it starts ranks 0 and 1 of 2"
batch_out="$state/batch.out"
printf -v batch '#!/usr/bin/env bash\nset -eo pipefail\n%q %q %q\nsrun --kill-on-bad-exit=1 %q %q %q | sort\n' \
    "$python" "${probe[@]}" "$python" "${probe[@]}"
job=$(sbatch --parsable -n 2 --overcommit -t 5 -J iris-batch --chdir "$PWD" -o "$batch_out" -e "$state/batch.err" \
    <<<"$batch")
# Polled here: `sbatch --wait` polls at growing intervals and noticed the end up to half a minute late.
deadline=$(( $(date +%s) + 300 ))
while job_state=$(scontrol -o show job "$job" | grep -o 'JobState=[A-Z_]*') \
        && [[ $job_state =~ =(PENDING|CONFIGURING|RUNNING|COMPLETING)$ ]]; do
    if [ "$(date +%s)" -gt "$deadline" ]; then
        echo "slurm: batch job $job did not end within 300 s" >&2
        exit 1
    fi
    sleep 0.5
done
job_exit=$(scontrol -o show job "$job" | grep -o ' ExitCode=[0-9:]*' || true)
if [ "$job_state" != JobState=COMPLETED ] || [ "$job_exit" != " ExitCode=0:0" ]; then
    echo "slurm: batch job $job ended with $job_state$job_exit:" >&2
    cat "$batch_out" "$state/batch.err" >&2 || true
    exit 1
fi
cat "$batch_out"
[ "$(cat "$batch_out")" = $'iris: solo rank 0 of 1\niris: slurm rank 0 of 2\niris: slurm rank 1 of 2' ] || {
    echo "slurm: in a batch script of 2 tasks, python must be a world of one and srun's tasks ranks 0, 1 of 2" >&2
    exit 1
}

say "the Quick start's program: srun -n 2 python examples/01_store/example.py --validate"
run 600 -n 2 "$python" examples/01_store/example.py --validate 2>&1 | tee "$state/store.out"
# One world of two ranks, not two worlds that each task spawned (what the examples do without a launcher).
[ "$(grep -c '^\[Iris\] \[[01]/2\] validation passed' "$state/store.out")" = 2 ] || {
    echo "slurm: examples/01_store under srun -n 2 must be one world of 2 ranks, each validated once" >&2
    exit 1
}

say "conformance smoke, part 1: srun -n 2 python examples/13_ccl/example.py --validate (every collective)"
run 600 -n 2 "$python" examples/13_ccl/example.py --validate

say "conformance smoke, part 2: srun -n 1 -c 2 python -m pytest conformance -q --ranks 2 (the suite in a step)"
run 900 -n 1 -c 2 "$python" -m pytest conformance -q -p no:cacheprovider --ranks 2

say "passed"
