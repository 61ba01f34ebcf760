#!/usr/bin/env bash
# Every GPU check and benchmark in one bounded command, run ON a GPU machine from the repository root with the
# library and the CLI prebuilt (target/release/libnvfuser_ipc.so and target/release/nvfipc; no
# cargo there). Stages, each bounded by `timeout` and logged under $OUT/<stage>.log:
#   gpu-check   the C API GPU suites under mpirun (scripts/gpu/check.sh, NVFIPC_GPU_RANKS)
#   release     buffer replacement on the device, with its PASS/FAIL summary
#               (scripts/gpu/release-check.sh without its benchmark: the bench stage has the pool)
#   cxx         the C++ wrapper suites over our store and c10d's (scripts/gpu/cxx-check.sh, NPS)
#   lifecycle   PyTorch allocator lifecycles, churn and random programs, expandable segments and
#               the default allocator (scripts/gpu/lifecycle-check.sh)
#   flat        the churn program at the largest rank count for 1,500 steps, timed: where a step's
#               time goes, its first 10% against its last (lifecycle-check.sh PARTS=flat)
#   symmetric   the symmetric rendezvous over PyTorch tensors, VMM and cudaMalloc
#               (scripts/gpu/symmetric-check.sh)
#   demo        `nvfipc demo --transport device` with the largest rank count
#   bench       `nvfipc bench` (exchange on the device; store and barrier on this machine's CPUs)
# $OUT/campaign.txt gets one line per stage (status, seconds); every log, report and plot is packed
# into $OUT/campaign.tgz, and the benchmark's tables, JSON and plots are also copied to $OUT
# itself. Exits non-zero when a stage fails.
#
#   OUT (default ./gpu-out), RANKS (default "2 4 8"), STAGES (the stages to run, default all of
#   the above), BENCH_SCENARIOS (default exchange,store,barrier), BENCH_TIMEOUT (seconds,
#   default 300)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
FINAL="$OUT"
OUT="$FINAL/campaign"
mkdir -p "$OUT"
RANKS="${RANKS:-2 4 8}"
largest="$(echo "$RANKS" | tr ' ' '\n' | sort -n | tail -1)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
summary="$OUT/campaign.txt"
: >"$summary"
failures=0

STAGES="${STAGES:-gpu-check release cxx lifecycle flat symmetric demo bench}"

stage() {
  local name="$1" limit="$2"
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  local start rc
  start=$(date +%s)
  echo "== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  rc=$?
  local took=$(($(date +%s) - start))
  if [ "$rc" -eq 0 ]; then
    echo "$name: ok in ${took}s" | tee -a "$summary"
  else
    echo "$name: FAILED rc=$rc in ${took}s (log: $OUT/$name.log)" | tee -a "$summary"
    failures=$((failures + 1))
  fi
  tail -25 "$OUT/$name.log"
}

nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv >"$OUT/gpus.csv" 2>&1
nvidia-smi topo -m >"$OUT/topo.txt" 2>&1
cat "$OUT/gpus.csv"

stage gpu-check 200 env OUT="$OUT/gpu-check" NVFIPC_GPU_RANKS="$RANKS" bash scripts/gpu/check.sh
stage release 300 env OUT="$OUT/release" RELEASE_BENCH=0 bash scripts/gpu/release-check.sh
stage cxx 150 env OUT="$OUT/cxx" NPS="$RANKS" bash scripts/gpu/cxx-check.sh
stage lifecycle 420 env OUT="$OUT/lifecycle" RANKS="$RANKS" bash scripts/gpu/lifecycle-check.sh
stage flat 300 env OUT="$OUT/flat" RANKS="$largest" PARTS=flat bash scripts/gpu/lifecycle-check.sh
stage symmetric 300 env OUT="$OUT/symmetric" RANKS="$RANKS" bash scripts/gpu/symmetric-check.sh
stage demo 60 target/release/nvfipc demo --ranks "$largest" --transport device --iters 20
mkdir -p "$OUT/bench"
stage bench "${BENCH_TIMEOUT:-300}" env NVFIPC_PYTHON="$(command -v python3)" \
  target/release/nvfipc bench --transport device \
  --scenario "${BENCH_SCENARIOS:-exchange,store,barrier}" \
  --json "$OUT/bench/bench.json" --svg-dir "$OUT/bench"

echo "== campaign: $failures failed stage(s)" | tee -a "$summary"
tar czf "$FINAL/campaign.tgz" -C "$FINAL" campaign
cp "$summary" "$OUT/bench.log" "$FINAL/" 2>/dev/null
cp "$OUT"/bench/*.svg "$OUT"/bench/bench.json "$FINAL/" 2>/dev/null
rm -rf "$OUT" # packed above into one archive
[ "$failures" -eq 0 ]
