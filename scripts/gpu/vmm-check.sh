#!/usr/bin/env bash
# VMM and pool memory on the GPU machine, run from the repository root with the library built
# elsewhere (target/release copied here): the GPU GoogleTest suites (scripts/gpu/check.sh, which
# includes GpuVmm.*), then real PyTorch tensors through tests/gpu/torch_vmm.py under mpirun with
# PyTorch's expandable segments, its default allocator and its cudaMallocAsync backend. Results
# (logs, one JSON line per rank and run) go to $OUT (default ./gpu-out). Non-zero on failure.
#
# Environment: OUT, NVFIPC_GPU_RANKS (for scripts/gpu/check.sh, default "2 4"), TORCH_RANKS (default
# "2 4"), SKIP_GTEST=1 (only the PyTorch runs).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lib="$root/target/release/libnvfuser_ipc.so"
[ -f "$lib" ] || { echo "gpu-vmm-check: $lib missing (build it where cargo is and copy target/release here)"; exit 1; }
fail=0
if [ -z "${SKIP_GTEST:-}" ]; then
  NVFIPC_GPU_RANKS="${NVFIPC_GPU_RANKS:-2 4}" OUT="$OUT/gtest" bash scripts/gpu/check.sh \
    >"$OUT/gtest.log" 2>&1 || { echo "gpu-vmm-check: GPU suites FAILED (gtest.log)"; fail=1; }
  tail -n 15 "$OUT/gtest.log"
  # nvFuser's scenarios (ShareIpcMemHandles, CudaComm, the pipelined ring, ...) over VMM buffers:
  # the cache suites with every device buffer a VMM allocation. Left out: the test that counts
  # legacy IPC opens, and the bad-pointer test (cudaMalloc specific).
  NVFIPC_GPU_DEVICE_MEMORY=vmm NVFIPC_GPU_RANKS="${NVFIPC_GPU_RANKS:-2 4}" OUT="$OUT/gtest-vmm" \
    NVFIPC_GPU_GTEST_FILTER='GpuCache.*:-GpuCache.OpensEqualClosesAfterTeardown:GpuCache.BadPointersGiveStatuses' \
    bash scripts/gpu/check.sh >"$OUT/gtest-vmm.log" 2>&1 ||
    { echo "gpu-vmm-check: cache suites over VMM buffers FAILED (gtest-vmm.log)"; fail=1; }
  grep -E "^-- np=|ALL GPU" "$OUT/gtest-vmm.log"
fi
python="$(command -v python3)"
port=29700
for ranks in ${TORCH_RANKS:-2 4}; do
  for conf in "expandable_segments:True=vmm" "=legacy" "backend:cudaMallocAsync=refused"; do
    alloc="${conf%=*}"
    expect="${conf##*=}"
    port=$((port + 1))
    name="torch-np$ranks-$expect"
    timeout -k 5 180 mpirun -np "$ranks" --oversubscribe \
      -x PYTORCH_CUDA_ALLOC_CONF="$alloc" -x EXPECT="$expect" -x NVFIPC_LIB="$lib" \
      -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" -x NVFIPC_TIMEOUT_MS=60000 \
      "$python" tests/gpu/torch_vmm.py >"$OUT/$name.jsonl" 2>"$OUT/$name.err"
    rc=$?
    oks=$(grep -c '"ok": true' "$OUT/$name.jsonl")
    echo "gpu-vmm-check: $name rc=$rc, $oks/$ranks ranks ok"
    if [ "$rc" -ne 0 ] || [ "$oks" -ne "$ranks" ]; then
      fail=1
      tail -n 20 "$OUT/$name.err"
    fi
  done
done
[ "$fail" -eq 0 ] && echo "gpu-vmm-check: PASSED" || echo "gpu-vmm-check: FAILED"
exit "$fail"
