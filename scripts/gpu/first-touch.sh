#!/usr/bin/env bash
# First touches on the GPU machine (one GPU, several ranks; no cargo there), run from the
# repository root with target/release/nvfipc and target/release/libnvfuser_ipc.so built
# elsewhere: the symmetric rendezvous of `nvfipc bench` (first contact of fresh processes
# against its floor, fresh rendezvous, cache hit) over VMM and cudaMalloc buffers, the same at
# W = 8 with every process's log at INFO (a timeline), PyTorch tensors through
# scripts/gpu/symmetric-check.sh, and the ring exchange (cold_large) at the largest W.
# Environment: OUT (default ./gpu-out/first-touch), RANKS (default 2,4,8,16), PARTS (default
# "symmetric timeline torch exchange").
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out/first-touch}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bin=target/release/nvfipc
RANKS="${RANKS:-2,4,8,16}"
PARTS="${PARTS:-symmetric store timeline torch exchange}"
fail=0
want() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }
step() {
  local name="$1"
  shift
  local start=$(date +%s)
  "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(($(date +%s) - start))s"
  [ "$rc" -eq 0 ] || { fail=1; tail -20 "$OUT/$name.log"; }
}
if want symmetric; then
  for mem in vmm legacy; do
    step "symmetric-$mem" timeout 300 "$bin" bench --scenario symmetric --transport device \
      --device-memory "$mem" --ranks "$RANKS" --json "$OUT/symmetric-$mem.json" \
      --svg-dir "$OUT/svg-$mem"
    grep -E "^[0-9]+ |first contact goes|floor goes|driver calls|vs its floor" "$OUT/symmetric-$mem.log"
  done
fi
if want store; then
  # The same with the job's store in the launcher's process instead of rank 0's.
  step symmetric-vmm-store-apart env NVFIPC_BENCH_STORE=launcher timeout 300 "$bin" bench \
    --scenario symmetric --transport device --device-memory vmm --ranks "$RANKS" \
    --json "$OUT/symmetric-vmm-store-apart.json"
  grep -E "^[0-9]+ |first contact goes|first contact's driver|vs its floor" \
    "$OUT/symmetric-vmm-store-apart.log"
fi
if want timeline; then
  # Every process's log at INFO (W = 8, VMM), with the store in rank 0 and apart.
  for where in rank0 launcher; do
    mkdir -p "$OUT/timeline-$where"
    step "timeline-$where" env NVFIPC_BENCH_STORE="$where" NVFIPC_DEBUG=INFO \
      NVFIPC_DEBUG_FILE="$OUT/timeline-$where/nvfipc.%p.log" timeout 120 "$bin" bench \
      --scenario symmetric --transport device --device-memory vmm --ranks 8
    tar -C "$OUT" -czf "$OUT/timeline-$where.tgz" "timeline-$where" && rm -rf "$OUT/timeline-$where"
  done
fi
if want torch; then
  step torch env OUT="$OUT/torch" RANKS="2 4 8" scripts/gpu/symmetric-check.sh
  grep -E "symmetric-np" "$OUT/torch.log"
  lib="$(realpath target/release/libnvfuser_ipc.so)"
  # np 8 over expandable segments with every process's log, the store in rank 0, then apart.
  for where in rank0 apart; do
    mkdir -p "$OUT/torch-$where"
    store=()
    if [ "$where" = apart ]; then
      "$bin" serve --port 29898 >"$OUT/torch-serve.log" 2>&1 &
      serve=$!
      sleep 1
      store=(-x NVFIPC_STORE_ADDR=127.0.0.1:29898)
    fi
    step "torch-$where" timeout -k 5 120 mpirun -np 8 --oversubscribe \
      -x PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -x NVFIPC_LIB="$lib" \
      -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29899 -x MIB=64 -x RESULT_DIR="$OUT/torch-$where" \
      -x NVFIPC_DEBUG=INFO -x NVFIPC_DEBUG_FILE="$OUT/torch-$where/nvfipc.%p.log" "${store[@]}" \
      python3 tests/gpu/torch_symmetric.py
    [ "$where" = apart ] && kill "$serve" 2>/dev/null
    python3 -c "import glob,json,statistics as s; r=[json.load(open(f)) for f in glob.glob('$OUT/torch-$where/rank*.json')]; print('torch-$where first_us', sorted(x['first_us'] for x in r))"
    tar -C "$OUT" -czf "$OUT/torch-$where.tgz" "torch-$where" && rm -rf "$OUT/torch-$where"
  done
fi
if want exchange; then
  step exchange timeout 300 "$bin" bench --scenario exchange --transport device --ranks "$RANKS" \
    --json "$OUT/exchange.json"
  grep -E "^[0-9]+ +(ours|floor)|cold_large|floor|closes" "$OUT/exchange.log" | head -40
fi
exit "$fail"
