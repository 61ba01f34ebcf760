#!/usr/bin/env bash
# Buffer replacement and the caching-allocator pattern on a real GPU, in one bounded command. Run
# ON the GPU machine from the repository root with the library and the CLI prebuilt elsewhere
# (target/release/libnvfuser_ipc.so and target/release/nvfipc; no cargo there):
#   1. gpu      the GPU GoogleTest binary (scripts/gpu/check.sh) under `mpirun -np 2`, both ranks on
#               one GPU: every suite, GpuRelease.* among them (a replacement exchange returns while
#               work queued before it waits on a flag set only afterwards; the old mapping still
#               delivers the old data, the next step the new; driver calls and an exchange are not
#               serialised behind the releaser; going back to a buffer whose mapping waits for
#               its close takes it back without a new open; 200 queued 256 MiB copies do not delay a
#               replacement; an exporter freeing a mapped buffer corrupts nothing; no CUDA error);
#   2. bench    `nvfipc bench --scenario exchange --transport device` (W = 2, 4, 8; cold, warm,
#               asym and pool, ours against the seed protocol), unless RELEASE_BENCH=0.
# Logs and results go to $OUT (default ./gpu-out/release); the last lines are a PASS/FAIL summary
# and the exit status is non-zero when anything failed.
#
#   OUT, RELEASE_RANKS (default 2), RELEASE_BENCH (default 1), GPU_TIMEOUT (seconds, default
#   240), BENCH_TIMEOUT (seconds, default 240), NVFIPC_GPU_GTEST_FILTER (optional)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out/release}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
summary="$OUT/release-summary.txt"
: >"$summary"
failures=0
say() { echo "$*" | tee -a "$summary"; }

say "== nvfuser-ipc release check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>&1 |
  sed 's/^/   gpu: /' | tee -a "$summary"
for f in target/release/libnvfuser_ipc.so target/release/nvfipc; do
  [ -f "$f" ] || { say "FAIL: $f missing (cargo build --release where cargo is, then copy target/release here)"; exit 1; }
done

# ---- 1. GPU suites, 2 ranks on one GPU -------------------------------------------------------
start=$(date +%s)
timeout --kill-after=20 "${GPU_TIMEOUT:-240}" env OUT="$OUT/gpu" \
  NVFIPC_GPU_RANKS="${RELEASE_RANKS:-2}" NVFIPC_GPU_RUN_TIMEOUT=$(( ${GPU_TIMEOUT:-240} - 60 )) \
  bash scripts/gpu/check.sh >"$OUT/gpu.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
logs=$(ls "$OUT"/gpu/np*.log 2>/dev/null)
count() { [ -n "$logs" ] && grep -h "$1" $logs 2>/dev/null | sed 's/^.*\] //' | sort -u; }
# Lines of the mpirun logs matching $1.
hits() {
  local n=0
  if [ -n "$logs" ]; then n=$(cat $logs | grep -c -- "$1" || true); fi
  echo "${n:-0}"
}
for t in HostFlagGatesStream ReplacementDoesNotWaitForGatedWork GoingBackTakesTheMappingBack \
  QueuedCopiesDoNotDelayReplacement ExporterFreesMappedBuffer; do
  name="GpuRelease.$t"
  ok=$(hits "\[       OK \] $name ")
  bad=$(hits "\[  FAILED  \] $name ")
  if [ "$ok" -gt 0 ] && [ "$bad" -eq 0 ]; then
    say "PASS  $name ($ok rank(s))"
  else
    say "FAIL  $name (ok on $ok rank(s), failed on $bad)"
    failures=$((failures + 1))
  fi
done
if [ "$rc" -eq 0 ]; then
  say "PASS  GPU suites under mpirun -np ${RELEASE_RANKS:-2} (${took}s)"
else
  say "FAIL  GPU suites under mpirun -np ${RELEASE_RANKS:-2}: rc=$rc after ${took}s (logs: $OUT/gpu, $OUT/gpu.log)"
  failures=$((failures + 1))
  count "\[  FAILED  \] [A-Za-z]" | sed 's/^/      failed: /' | tee -a "$summary"
  tail -n 30 "$OUT/gpu.log" | sed 's/^/      | /'
fi
# What the tests measured and saw (no assertions on time).
{ [ -n "$logs" ] && grep -h "GpuRelease" $logs | grep -E "NVFIPC_TIMING|freed peer buffer" ||
  true; } | sed 's/^\[[0-9,]*\]<stdout>://; s/^/      /' | tee -a "$summary"
[ -n "$logs" ] && grep -h "Failure\|Expected\|Which is\|the watchdog\|serialised\|waited for" $logs |
  head -n 40 | sed 's/^/      /' | tee -a "$summary"

# ---- 2. exchange benchmark with the pool scenario -----------------------------------------------
if [ "${RELEASE_BENCH:-1}" != 0 ]; then
  start=$(date +%s)
  mkdir -p "$OUT/bench"
  timeout --kill-after=20 "${BENCH_TIMEOUT:-240}" target/release/nvfipc bench --transport device \
    --scenario exchange --json "$OUT/bench/bench.json" --svg-dir "$OUT/bench" \
    >"$OUT/bench.log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  if [ "$rc" -eq 0 ]; then
    say "PASS  nvfipc bench --scenario exchange --transport device (${took}s)"
  else
    say "FAIL  nvfipc bench: rc=$rc after ${took}s (log: $OUT/bench.log)"
    failures=$((failures + 1))
    tail -n 20 "$OUT/bench.log" | sed 's/^/      | /'
  fi
  grep -E "^W |^[0-9]+ +(ours|seed|floor)|^pool at|pool at W=.* vs seed" "$OUT/bench.log" |
    sed 's/^/      /' | tee -a "$summary"
fi

if [ "$failures" -eq 0 ]; then
  say "RELEASE CHECK: PASS"
else
  say "RELEASE CHECK: FAIL ($failures failed item(s); logs in $OUT)"
fi
[ "$failures" -eq 0 ]
