#!/usr/bin/env bash
# The performance round on a GPU machine, run from the repository root with the library and the
# CLI prebuilt (target/release/libnvfuser_ipc.so and target/release/nvfipc; no cargo there):
# `nvfipc bench` runs, each bounded by `timeout`, one after the other on a quiet machine.
#
#   exchange      ring exchange (cold, cold_large, warm, asym, pool with its phases and store
#                 round trips) at W = 2, 4, 8 over cudaMalloc buffers
#   post          the host-side cost of one post (channel handle and cache + request)
#   exchange-vmm  the same exchange over VMM buffers laid out like PyTorch's expandable segments
#   scale         warm and pool at W = 16 and 32 processes on the one GPU
#   symmetric     the symmetric rendezvous against group size, VMM and cudaMalloc buffers
#   torch-ours    ours over PyTorch tensors (scripts/gpu/symmetric-check.sh: the same 64 MiB
#                 tensors, both allocators, with its checks of views and releases)
#   torch-symm    PyTorch's own symmetric-memory rendezvous at W = 2, 4, 8 (the baseline:
#                 tests/gpu/torch_symm_mem_baseline.py; one JSON line per rank)
#
# Results under $OUT/<run>.{txt,json} and plots under $OUT/<run>/; everything is also packed into
# $OUT/perf.tgz. Environment: OUT (default ./gpu-out/perf), PERF_RUNS (the runs to do, default
# all of the above), PERF_TIMEOUT_SCALE (multiplies every limit, default 1), PERF_PACKED_ONLY=1
# (leave only perf.tgz and perf.txt under $OUT, for a transport that returns few files).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out/perf}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
RUNS="${PERF_RUNS:-exchange post exchange-vmm scale symmetric-vmm torch-symm torch-ours}"
scale="${PERF_TIMEOUT_SCALE:-1}"
nvfipc="$PWD/target/release/nvfipc"
[ -x "$nvfipc" ] || { echo "perf-check: $nvfipc missing (build it where cargo is)" >&2; exit 1; }
failures=0

bench() { # name limit args...
  local name="$1" limit="$2"
  shift 2
  case " $RUNS " in *" $name "*) ;; *) return 0 ;; esac
  limit=$(awk -v l="$limit" -v s="$scale" 'BEGIN { printf "%d", l * s }')
  mkdir -p "$OUT/$name"
  local start=$(date +%s)
  echo "== $name (limit ${limit}s): nvfipc bench $*"
  timeout -k 5 "$limit" "$nvfipc" bench "$@" --json "$OUT/$name.json" --svg-dir "$OUT/$name" \
    >"$OUT/$name.txt" 2>&1
  local rc=$?
  echo "$name: rc=$rc in $(($(date +%s) - start)) s" | tee -a "$OUT/perf.txt"
  [ "$rc" -eq 0 ] || failures=$((failures + 1))
  tail -n 40 "$OUT/$name.txt"
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1
bench exchange 200 --transport device --scenario exchange
bench post 60 --transport device --scenario post
bench exchange-vmm 200 --transport device --device-memory vmm --scenario exchange
bench scale 240 --transport device --scenario exchange --ranks 16,32
bench symmetric 120 --transport device --scenario symmetric
bench symmetric-vmm 120 --transport device --device-memory vmm --scenario symmetric

if [[ " $RUNS " == *" torch-ours "* ]]; then
  start=$(date +%s)
  OUT="$OUT/torch-ours" timeout -k 5 240 bash scripts/gpu/symmetric-check.sh >"$OUT/torch-ours.txt" 2>&1
  echo "torch-ours: rc=$? in $(($(date +%s) - start)) s" | tee -a "$OUT/perf.txt"
  tail -n 12 "$OUT/torch-ours.txt"
fi
if [[ " $RUNS " == *" torch-symm "* ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  port=29970
  for np in 2 4 8; do
    port=$((port + 1))
    timeout -k 5 90 mpirun -np "$np" --oversubscribe -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
      -x MIB="${MIB:-64}" python3 tests/gpu/torch_symm_mem_baseline.py \
      >"$OUT/torch-symm-np$np.jsonl" 2>"$OUT/torch-symm-np$np.err"
    echo "torch-symm np$np: rc=$? $(grep -c '"ok": true' "$OUT/torch-symm-np$np.jsonl")/$np ranks ok" |
      tee -a "$OUT/perf.txt"
    # Why a rank had no result, in the summary itself (the per-rank files may not come back).
    grep -ho '"error": "[^"]*"' "$OUT/torch-symm-np$np.jsonl" | sort | uniq -c | head -3 |
      tee -a "$OUT/perf.txt"
    grep -v '^\s*$' "$OUT/torch-symm-np$np.err" | tail -n 3 | tee -a "$OUT/perf.txt"
  done
fi

tar -czf "$OUT/perf.tgz" -C "$OUT" --exclude=perf.tgz .
if [ "${PERF_PACKED_ONLY:-0}" = 1 ]; then
  find "$OUT" -mindepth 1 -maxdepth 1 ! -name perf.tgz ! -name perf.txt -exec rm -rf {} +
fi
echo "perf-check: $failures run(s) failed"
[ "$failures" -eq 0 ]
