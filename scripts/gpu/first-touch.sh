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
PARTS="${PARTS:-symmetric timeline torch exchange}"
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
if want timeline; then
  mkdir -p "$OUT/timeline"
  step timeline env NVFIPC_DEBUG=INFO NVFIPC_DEBUG_FILE="$OUT/timeline/nvfipc.%p.log" \
    timeout 120 "$bin" bench --scenario symmetric --transport device --device-memory vmm --ranks 8
fi
if want torch; then
  step torch env OUT="$OUT/torch" RANKS="2 4 8" scripts/gpu/symmetric-check.sh
  grep -E "symmetric-np" "$OUT/torch.log"
  mkdir -p "$OUT/torch-timeline"
  lib="$(realpath target/release/libnvfuser_ipc.so)"
  step torch-timeline timeout -k 5 120 mpirun -np 8 --oversubscribe \
    -x PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -x NVFIPC_LIB="$lib" \
    -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29899 -x MIB=64 -x RESULT_DIR="$OUT/torch-timeline" \
    -x NVFIPC_DEBUG=INFO -x NVFIPC_DEBUG_FILE="$OUT/torch-timeline/nvfipc.%p.log" \
    python3 tests/gpu/torch_symmetric.py
fi
if want exchange; then
  largest="${RANKS##*,}"
  [ "$largest" -gt 8 ] && largest=8
  step exchange timeout 300 "$bin" bench --scenario exchange --transport device --ranks "$largest" \
    --json "$OUT/exchange.json"
  grep -E "cold_large|floor" "$OUT/exchange.log" | head -20
fi
exit "$fail"
