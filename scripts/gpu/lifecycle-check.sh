#!/usr/bin/env bash
# Allocator lifecycles on the GPU machine (one GPU, several ranks; no cargo there): run from the
# repository root with the library built elsewhere. Stages, each bounded by `timeout`, logs and one
# JSON line per rank under $OUT:
#   probe    tests/gpu/vmm_block_ids.c: does the driver give every new VMM physical allocation a
#            new MEMORY_BLOCK_ID while one reserved range is remapped (as expandable segments do)?
#   churn    tests/gpu/torch_lifecycle.py MODE=churn (the churn program) with PyTorch's expandable
#            segments at each rank count, with its default allocator at the largest, and with the
#            script's own expandable-segments-like VMM allocator (ALLOC=vmm) at 4
#   random   MODE=random for each seed: random lifecycles, caches re-created at agreed steps, over
#            expandable segments (np 2, 4), the default allocator, the script's VMM allocator and
#            an IPC-capable stream-ordered pool (ALLOC=pool)
#   before   (when OLD_LIB names an older build) the churn program on it, to show what it fixes
#   flat     (only when PARTS names it) the churn program at the largest rank count for FLAT_STEPS
#            steps with TIMING=1, over expandable segments and the default allocator: where each
#            step's time goes, its first 10% against its last (scripts/gpu/flat-report.py)
# Environment: OUT (default ./gpu-out/lifecycle), NVFIPC_LIB (default
# target/release/libnvfuser_ipc.so), OLD_LIB, RANKS (default "2 4 8"), SEEDS (default "1 2 3"),
# STEPS (default 200), RANDOM_STEPS (default 120), PARTS (default "probe churn random"),
# FLAT_STEPS (default 1500). Non-zero when a stage fails.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/gpu-out/lifecycle}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lib="$(realpath "${NVFIPC_LIB:-$root/target/release/libnvfuser_ipc.so}")"
[ -f "$lib" ] || { echo "gpu-lifecycle-check: $lib missing"; exit 1; }
python="$(command -v python3)"
RANKS="${RANKS:-2 4 8}"
largest="$(echo "$RANKS" | tr ' ' '\n' | sort -n | tail -1)"
summary="$OUT/summary.txt"
: >"$summary"
fail=0
port=29800
PARTS="${PARTS:-probe churn random}"
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

# run NAME LIB RANKS ALLOC_CONF VAR=VALUE...: one mpirun of torch_lifecycle.py.
run() {
  local name="$1" use_lib="$2" np="$3" alloc="$4"
  shift 4
  port=$((port + 1))
  local start
  start=$(date +%s)
  timeout -k 5 240 mpirun -np "$np" --oversubscribe \
    -x PYTORCH_CUDA_ALLOC_CONF="$alloc" -x NVFIPC_LIB="$use_lib" \
    -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" -x NVFIPC_TIMEOUT_MS=60000 \
    $(for kv in "$@"; do printf -- '-x %s ' "$kv"; done) \
    "$python" tests/gpu/torch_lifecycle.py >"$OUT/$name.jsonl" 2>"$OUT/$name.err"
  local rc=$?
  local oks
  # Count reports, not lines: mpirun may forward two ranks' lines without a newline between them.
  oks=$(grep -o '"ok": true' "$OUT/$name.jsonl" | wc -l)
  echo "$name: rc=$rc, $oks/$np ranks ok, $(($(date +%s) - start))s" | tee -a "$summary"
  if [ "$rc" -ne 0 ] || [ "$oks" -ne "$np" ]; then
    grep -h '"error"' "$OUT/$name.jsonl" | head -2 | cut -c1-900
    grep -v '^\s*$' "$OUT/$name.err" | tail -n 8 | cut -c1-400
    return 1
  fi
}

if want probe; then
echo "== probe"
cuda_inc="$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")/include"
if gcc -O2 -I"$cuda_inc" tests/gpu/vmm_block_ids.c -lcuda -o "$OUT/vmm_block_ids" >"$OUT/probe-build.log" 2>&1; then
  timeout 60 "$OUT/vmm_block_ids" >"$OUT/probe.txt" 2>&1
  echo "probe: rc=$? $(tail -1 "$OUT/probe.txt")" | tee -a "$summary"
else
  echo "probe: build FAILED" | tee -a "$summary"
  fail=1
fi
fi

if [ -n "${OLD_LIB:-}" ]; then
  echo "== before (older build, expected to fail)"
  run before-churn-np4 "$(realpath "$OLD_LIB")" 4 expandable_segments:True MODE=churn STEPS="${STEPS:-200}" || true
  run before-churn-np4-noempty "$(realpath "$OLD_LIB")" 4 expandable_segments:True MODE=churn EMPTY=0 STEPS="${STEPS:-200}" || true
fi

if want churn; then
echo "== churn"
for np in $RANKS; do
  run "churn-np$np-vmm" "$lib" "$np" expandable_segments:True MODE=churn STEPS="${STEPS:-200}" || fail=1
done
run "churn-np4-vmm-noempty" "$lib" 4 expandable_segments:True MODE=churn EMPTY=0 STEPS="${STEPS:-200}" || fail=1
run "churn-np$largest-default" "$lib" "$largest" "" MODE=churn STEPS="${STEPS:-200}" || fail=1
run "churn-np4-arena" "$lib" 4 "" MODE=churn ALLOC=vmm STEPS="${STEPS:-200}" || fail=1
fi

if want flat; then
echo "== flat"
for alloc in expandable_segments:True ""; do
  label=default
  [ -n "$alloc" ] && label=vmm
  name="flat-np$largest-$label"
  run "$name" "$lib" "$largest" "$alloc" MODE=churn TIMING=1 STEPS="${FLAT_STEPS:-1500}" || fail=1
  "$python" scripts/gpu/flat-report.py "$OUT/$name.jsonl" | tee -a "$summary"
done
fi

if want random; then
echo "== random"
for seed in ${SEEDS:-1 2 3}; do
  for np in 2 4; do
    run "random-s$seed-np$np-vmm" "$lib" "$np" expandable_segments:True MODE=random SEED="$seed" STEPS="${RANDOM_STEPS:-120}" || fail=1
  done
  run "random-s$seed-np4-default" "$lib" 4 "" MODE=random SEED="$seed" STEPS="${RANDOM_STEPS:-120}" || fail=1
  run "random-s$seed-np4-arena" "$lib" 4 "" MODE=random ALLOC=vmm SEED="$seed" STEPS="${RANDOM_STEPS:-120}" || fail=1
  run "random-s$seed-np4-pool" "$lib" 4 "" MODE=random ALLOC=pool SEED="$seed" STEPS="${RANDOM_STEPS:-120}" || fail=1
done
fi
echo "== summary"
cat "$summary"
# Everything in one archive, easy to copy back from the GPU machine.
tar -czf "$OUT.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")"
[ "$fail" -eq 0 ] && echo "gpu-lifecycle-check: PASSED" || echo "gpu-lifecycle-check: FAILED"
exit "$fail"
