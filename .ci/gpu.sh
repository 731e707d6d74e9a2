#!/usr/bin/env bash
# GPU verification (not run by CI, which has no GPU): tests, conformance (thorough), examples and the benchmarks.
#   every GPU of the node, one rank each (2, 4 or 8):  bash .ci/gpu.sh
#   one GPU, simulation at 4 ranks:  IRIS_SIMULATION=1 bash .ci/gpu.sh
#   the GPU gate (about 3 minutes on 2 x H200; run before device code lands):  bash .ci/gpu.sh --quick
#   the gate in parts, where one command must stay short (one GPU of 16 cores: about 4 minutes whole):
#     bash .ci/gpu.sh --quick --part 1/2, then --part 2/2 (each 1/N of the test files; the node's conformance
#     run in the first part, the 4 simulated ranks' in the last; a part's line reads "gate part K/N")
#     every public device op, collective and fused op against torch (tests/), the conformance suite at
#     profile ci on the node's GPUs, and the same at 4 ranks on one GPU with IRIS_SIMULATION=1, side by side.
# A test still running past IRIS_TEST_TIMEOUT has its process's stacks in its step's log (faulthandler), and a
# gate stopped by a time limit names the tests each step had started and not finished (a hang is one of them).
# Logs go to one archive, $OUT/gpu-logs.tgz (the device tool's output folder; written even when a time limit
# stops the gate), or to ./gpu-logs. Where .git is stale (a copied tree), pass the commit for the benchmark
# CSVs: IRIS_COMMIT=<git rev-parse --short HEAD> bash .ci/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export IRIS_TEST_TIMEOUT=${IRIS_TEST_TIMEOUT:-120}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
logs="${OUT:-gpu-logs}"
if [ -n "${OUT:-}" ]; then
  # The device tool brings back only a few files of $OUT: every log goes into one archive, gpu-logs.tgz,
  # written on exit, also when a time limit stops the gate (timeout's TERM).
  logs=$(mktemp -d)
  trap 'tar czf "$OUT/gpu-logs.tgz" -C "$logs" . 2>/dev/null' EXIT
  trap 'still_running; echo "[gpu.sh] stopped: the logs so far are in $OUT/gpu-logs.tgz"; exit 143' TERM INT
fi
mkdir -p "$logs"
tag=$([ "${IRIS_SIMULATION:-0}" = 1 ] && echo sim || echo gpu)
gpus=$(python -c 'import torch; print(torch.cuda.device_count())')
ranks=$([ "$tag" = sim ] && echo 4 || echo "$gpus")
status=0
# shellcheck disable=SC2329  # called from the TERM trap above
still_running() {  # the tests each pytest step had started and not finished (a hang is one of them)
  local f
  for f in "$logs"/*-failures.txt.running; do
    [ -s "$f" ] && sed "s/^/[gpu.sh] $(basename "$f" -failures.txt.running): still running: /" "$f"
  done
  return 0
}
step() {  # step NAME COMMAND...: run, log, remember failure, print one summary line
  local name=$1; shift
  local failures="$logs/$tag-$name-failures.txt"  # a pytest step names each failure there as it happens
  rm -f "$failures"
  IRIS_FAILURE_LOG="$failures" "$@" >"$logs/$tag-$name.log" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && status=1
  echo "[$tag] $name: exit $rc; $(grep -E 'passed|failed|error|received|consumed' "$logs/$tag-$name.log" | tail -1)"
  if [ -s "$failures" ]; then sed "s/^/[$tag] $name: /" "$failures"; fi
}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | sed "s/^/[$tag] gpu: /"
python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
python -m iris info >"$logs/$tag-info.txt" 2>&1  # versions, GPUs and peer access, switches: beside every log
if [ "${1:-}" = --quick ]; then
  part=1 parts=1
  if [ "${2:-}" = --part ]; then
    if ! [[ "${3:-}" =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 1 ] \
        || [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
      echo "[gpu.sh] --part takes K/N with 1 <= K <= N, e.g. --part 1/2; got '${3:-}'" >&2; exit 2
    fi
    part=${BASH_REMATCH[1]} parts=${BASH_REMATCH[2]}
  fi
  # this part's test files: every N-th of the files by size (large first), so the parts take about as long
  # shellcheck disable=SC2012  # the test files have plain names
  test_files=$(ls -S tests/test_*.py | awk -v k="$part" -v n="$parts" '(NR - 1) % n == k - 1')
  # Compiling the kernels (a fresh machine has no Triton cache) is most of the time: pytest-xdist spreads
  # the tests over workers (each with its own ranks), so kernels compile side by side on the host's cores.
  workers=$(( $(nproc) / 2 < 8 ? $(nproc) / 2 : 8 ))
  # The tests outlast the two conformance runs (cold, 2 x H100, 32 cores, 8 workers: 485 s alone, against
  # 160 s for each conformance run), which free their cores after that: the tests take half again as many
  # workers where there are 24 cores or more (at 5ed2403 the whole gate ran past 560 s with 8).
  # --dist loadfile keeps a file on one worker (its rank pools started once), so the longest file sets the
  # time: the fused ops' tests are four files for this (per-test times: quick-tests.xml). pytest 9.2's
  # --dist loadgroup does not group (pytest-xdist issue 1386).
  test_workers=$(( $(nproc) >= 24 ? workers * 3 / 2 : workers ))
  started=$(date +%s)
  [ "$gpus" -ge 2 ] && node_ranks=$gpus || node_ranks=2
  node_env=$([ "$gpus" -ge 2 ] && echo "IRIS_SIMULATION=0" || echo "IRIS_SIMULATION=1")
  # Each session names its failures in quick-<name>-failures.txt as they happen (a killed gate still tells).
  rm -f "$logs"/quick-*-failures.txt
  # The default tier (every device op, collective and fused op at 2 ranks); the full run below adds the slow one.
  # shellcheck disable=SC2086  # the file list splits on purpose
  env "$node_env" IRIS_FAILURE_LOG="$logs/quick-tests-failures.txt" \
    python -m pytest $test_files -q -p no:cacheprovider -n "$test_workers" --dist loadfile --durations=25 \
    -o faulthandler_timeout="$IRIS_TEST_TIMEOUT" --junitxml="$logs/quick-tests.xml" >"$logs/quick-tests.log" 2>&1 &
  jobs_run="tests:$!"
  if [ "$part" = 1 ]; then
    env "$node_env" IRIS_FAILURE_LOG="$logs/quick-conformance-failures.txt" \
      python -m pytest conformance -q -p no:cacheprovider -n "$workers" --ranks "$node_ranks" \
      --hypothesis-profile ci >"$logs/quick-conformance.log" 2>&1 &
    jobs_run="$jobs_run conformance:$!"
  fi
  if [ "$part" = "$parts" ]; then
    IRIS_SIMULATION=1 CUDA_VISIBLE_DEVICES=0 IRIS_FAILURE_LOG="$logs/quick-sim4-failures.txt" \
      python -m pytest conformance -q -p no:cacheprovider -n "$workers" --ranks 4 --hypothesis-profile ci \
      >"$logs/quick-sim4.log" 2>&1 &
    jobs_run="$jobs_run sim4:$!"
  fi
  sampler="" counter=""
  if command -v nvidia-smi >/dev/null; then  # each GPU's memory every second: how full it was at an out-of-memory
    nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits -lms 1000 \
      >"$logs/quick-memory.log" 2>/dev/null &
    sampler=$!
    # and how many processes held a CUDA context, and the host memory still available (the out-of-memory
    # at a context's creation came with 35.7 of 143.8 GB of GPU memory in use: GPU memory was not what ran
    # out; a context also takes host memory, and every rank process holds torch and Triton)
    while sleep 1; do
      echo "$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | wc -l)" \
        "$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)"
    done >"$logs/quick-processes.log" &
    counter=$!
  fi
  for job in $jobs_run; do
    name=${job%%:*}
    wait "${job#*:}" || status=1
    echo "[quick] $name: $(grep -E 'passed|failed|error' "$logs/quick-$name.log" | tail -1)"
    # the slowest tests: what to look at when the gate creeps toward the device's 600 s a call
    [ "$name" = tests ] && sed -n '/slowest 25 durations/,/^$/p' "$logs/quick-tests.log" | sed -n '2,6{/^$/!s/^/[quick] slow: /p}'
    if [ -s "$logs/quick-$name-failures.txt" ]; then sed "s/^/[quick] $name: /" "$logs/quick-$name-failures.txt"; fi
  done
  if [ -n "$sampler" ]; then
    kill "$sampler" "$counter" 2>/dev/null
    echo "[quick] GPU memory at its peak: $(awk -F', *' '$2 > peak[$1] { peak[$1] = $2; total[$1] = $3 }
      END { for (g in peak) printf "GPU %s %d of %d MiB; ", g, peak[g], total[g] }' "$logs/quick-memory.log")" \
      "processes with a CUDA context at most: $(sort -n "$logs/quick-processes.log" | tail -1 | cut -d' ' -f1);" \
      "host memory available at least: $(sort -k2 -n "$logs/quick-processes.log" | head -1 | cut -d' ' -f2) of" \
      "$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo) MiB"
  fi
  echo "[quick] gate$([ "$parts" -gt 1 ] && echo " part $part/$parts"):" \
    "$([ $status = 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - started )) s" \
    "($gpus GPU(s), $node_ranks ranks on the node, 4 simulated ranks on GPU 0)"
  exit $status
fi
step tests env IRIS_TEST_WORLDS="${IRIS_TEST_WORLDS:-2,4}" python -m pytest tests -q -p no:cacheprovider -m "" \
  -o faulthandler_timeout="$IRIS_TEST_TIMEOUT"
if [ "$tag" = sim ]; then
  step conformance4 python -m pytest conformance -q -p no:cacheprovider --ranks 4 --hypothesis-profile thorough
  step conformance8 python -m pytest conformance -q -p no:cacheprovider --ranks 8 --hypothesis-profile thorough
else
  step conformance python -m pytest conformance -q -p no:cacheprovider --ranks "$ranks" --hypothesis-profile thorough
fi
# The example catalogue (examples/README.md) at its GPU sizes, each checked; those with --benchmark timed too.
for example in examples/[0-9][0-9]_*/example.py; do
  name=$(basename "$(dirname "$example")")
  extra=()
  case "$name" in
    0[0-6]_*) ;;  # the data-movement examples always time themselves
    15_*) extra=(--benchmark --trace "$logs/$tag-trace.json") ;;
    *) extra=(--benchmark) ;;
  esac
  step "$name" python -m iris run -n "$ranks" --timeout 300 "$example" --validate "${extra[@]}"
done
if [ "$tag" = gpu ]; then
  step rma python -m iris run -n "$ranks" --timeout 580 benchmarks/rma.py --validate --pairs all --csv "$logs/rma.csv"
  step latency python -m iris run -n "$ranks" --timeout 300 benchmarks/latency.py --csv "$logs/latency.csv"
  step ccl python -m iris run -n "$ranks" --timeout 580 benchmarks/ccl.py --validate --csv "$logs/ccl.csv"
  step ops python -m iris run -n "$ranks" --timeout 580 benchmarks/ops.py --validate --csv "$logs/ops.csv"
  grep -E "^\[rank 0\] (one_way_flag|barrier)" "$logs/gpu-latency.log"
  grep -E "^\[rank 0\] +[0-9]" "$logs/gpu-rma.log" | tail -40
fi
exit $status
