#!/usr/bin/env bash
# GPU run of the C++ wrapper suites (cpp_tests/cxx: ShareIpcMemHandles, CudaComm, pipelined ring
# allgather with device buffers; over our store and over c10d's TCPStore through the adapter) and,
# when a seed checkout of nvFuser is present, the drop-in compile check. Runs ON the GPU machine from
# the repository root with target/release/libnvfuser_ipc.so prebuilt (no cargo there).
#   NPS (default "2 4 8"), RUN_TIMEOUT (seconds per mpirun, default 45), OUT (default ./gpu-out),
#   NVFUSER_SEED (checkout for scripts/nvfuser/dropin-check.sh, default build/nvfuser-seed)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
TORCH="$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))' 2>/dev/null)"
failures=0
seed="${NVFUSER_SEED:-build/nvfuser-seed}"
if [ -d "$seed" ]; then
  if timeout 200 bash scripts/nvfuser/dropin-check.sh "$seed" "$OUT/dropin" >"$OUT/dropin.log" 2>&1; then
    echo "== drop-in check passed"
  else
    echo "== drop-in check FAILED (log: $OUT/dropin.log)"; failures=$((failures + 1))
  fi
  tail -22 "$OUT/dropin.log"
fi
if ! cmake -S cpp_tests/cxx -B build/gpu-cxx -DNVFIPC_PREBUILT_LIB_DIR="$PWD/target/release" \
    -DCMAKE_PREFIX_PATH="$TORCH/share/cmake" -DCMAKE_BUILD_TYPE=Release >"$OUT/cxx-configure.log" 2>&1; then
  echo "CONFIGURE FAILED"; tail -40 "$OUT/cxx-configure.log"; exit 1
fi
if ! cmake --build build/gpu-cxx -j"$(nproc)" >"$OUT/cxx-build.log" 2>&1; then
  echo "BUILD FAILED"; grep -E "error" "$OUT/cxx-build.log" | head -40; exit 1
fi
export LD_LIBRARY_PATH="$PWD/target/release:${LD_LIBRARY_PATH:-}"
for bin in nvfipc_cxx_tests nvfipc_cxx_c10d_tests; do
  if [ ! -x "build/gpu-cxx/$bin" ]; then
    echo "== $bin not built (Torch missing for the c10d suite?)"; continue
  fi
  for np in ${NPS:-2 4 8}; do
    port=$((20000 + RANDOM % 20000))
    log="$OUT/$bin-np$np.log"
    timeout -k 5 "${RUN_TIMEOUT:-45}" mpirun --allow-run-as-root --oversubscribe -np "$np" --tag-output \
      -x NVFIPC_TEST_DEVICE=1 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" -x LD_LIBRARY_PATH \
      -x NVFIPC_GPU_TEST_TIMEOUT_MS=15000 \
      "build/gpu-cxx/$bin" --gtest_filter='*DeviceScenarios*' --gtest_color=no >"$log" 2>&1
    rc=$?
    # Every rank must pass every device scenario (ShareIpcMemHandles, CudaComm, ChannelComm,
    # RingAllgather, Symmetric) and fail none.
    # Each rank's GoogleTest summary: "[  PASSED  ] N tests." with no "[  FAILED  ]" line.
    passed=$(grep -cE '\[  PASSED  \] [0-9]+ tests?\.' "$log")
    tests=$(grep -oE '\[  PASSED  \] [0-9]+ tests?' "$log" | head -1 | grep -oE '[0-9]+')
    echo "== $bin np=$np rc=$rc: $passed of $np ranks passed ${tests:-0} tests"
    if [ "$rc" -ne 0 ] || [ "$passed" -ne "$np" ] || grep -q '\[  FAILED  \]' "$log"; then
      failures=$((failures + 1)); grep -E "FAILED|rank [0-9]+:" "$log" | head -10
    fi
    grep -h "NVFIPC_TIMING" "$log" | sed 's/^.*NVFIPC_TIMING //' | grep "rank=0 "
  done
done
[ "$failures" -eq 0 ] && echo "== ALL C++ DEVICE SUITES PASSED" || { echo "== $failures FAILED"; exit 1; }
