#!/usr/bin/env bash
# GPU check, run ON the GPU machine from the repository root, with the library already built
# elsewhere (no cargo needed here):
#   cargo build --release --lib            # on the build machine
#   bash scripts/gpu/check.sh              # on the GPU machine, target/release/libnvfuser_ipc.so present
# Builds the GPU GoogleTest suites (cpp_tests/gpu) against the prebuilt library, runs them under
# `mpirun -np 2`, `-np 4` and `-np 8` (all ranks share the visible GPUs: local_rank % count), each
# bounded by `timeout`, and writes logs, per-rank JSON results, timings and a summary to $OUT
# (default ./gpu-out). Exits non-zero when anything fails.
#
# Environment: OUT, NVFIPC_PREBUILT_LIB_DIR (default target/release), NVFIPC_GPU_BUILD_DIR
# (default build/gpu), NVFIPC_GPU_RANKS (default "2 4 8"), NVFIPC_GPU_RUN_TIMEOUT (seconds per
# mpirun, default 150), NVFIPC_GPU_GTEST_FILTER (optional --gtest_filter), NVFIPC_GPU_DEVICE_MEMORY
# (vmm: the suites' device buffers are VMM allocations instead of cudaMalloc ones).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/gpu-out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
lib_dir="${NVFIPC_PREBUILT_LIB_DIR:-$root/target/release}"
build_dir="${NVFIPC_GPU_BUILD_DIR:-$root/build/gpu}"
ranks_list="${NVFIPC_GPU_RANKS:-2 4 8}"
run_timeout="${NVFIPC_GPU_RUN_TIMEOUT:-150}"
summary="$OUT/summary.txt"
: >"$summary"

say() { echo "$*" | tee -a "$summary"; }
die() {
  say "FAILED: $*"
  exit 1
}

say "== nvfuser-ipc GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ) in $root"
say "-- output directory: $OUT"

# ---- machine and tool versions (recorded, never fatal) -------------------------------------
{
  echo "== nvidia-smi"
  nvidia-smi || echo "nvidia-smi failed (rc $?)"
  echo "== nvidia-smi topo"
  nvidia-smi topo -m || true
  echo "== nvcc";    nvcc --version || echo "nvcc not found"
  echo "== cmake";   cmake --version || echo "cmake not found"
  echo "== g++";     g++ --version || echo "g++ not found"
  echo "== ninja";   ninja --version || echo "ninja not found"
  echo "== mpirun";  mpirun --version || echo "mpirun not found"
  echo "== library"; ls -l "$lib_dir/libnvfuser_ipc.so" || true
} 2>&1 | tee "$OUT/versions.txt"

for tool in cmake mpirun timeout; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
[ -f "$lib_dir/libnvfuser_ipc.so" ] ||
  die "$lib_dir/libnvfuser_ipc.so not found: build it with 'cargo build --release --lib' where cargo is and copy target/release here"
[ -f "$root/include/nvfuser_ipc.h" ] || die "include/nvfuser_ipc.h missing"

# ---- configure and build ---------------------------------------------------------------------
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
prefix_path=""
if command -v python3 >/dev/null; then
  # PyTorch ships CMake configs (and, on some machines, GTest) under share/cmake.
  prefix_path="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "share", "cmake"))' 2>/dev/null || true)"
fi
common_args=("${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNVFIPC_PREBUILT_LIB_DIR="$lib_dir")
if [ -n "$prefix_path" ]; then common_args+=(-DCMAKE_PREFIX_PATH="$prefix_path"); fi

say "== configure (top level, prebuilt library) in $build_dir"
if ! cmake -S "$root" -B "$build_dir" "${common_args[@]}" -DNVFIPC_BUILD_TESTS=ON -DNVFIPC_BUILD_CLI=OFF \
    >"$OUT/configure.log" 2>&1; then
  say "-- top-level configure failed (see configure.log); trying cpp_tests/gpu standalone"
  build_dir="$build_dir-standalone"
  cmake -S "$root/cpp_tests/gpu" -B "$build_dir" "${common_args[@]}" \
    >>"$OUT/configure.log" 2>&1 || { tail -n 40 "$OUT/configure.log"; die "configure failed (configure.log)"; }
fi
if grep -q "GPU tests SKIPPED" "$OUT/configure.log"; then
  grep "GPU tests SKIPPED" -A2 "$OUT/configure.log" | tee -a "$summary"
  die "the GPU suites were not configured (no CUDA toolkit found)"
fi
say "== build nvfipc_gpu_tests"
cmake --build "$build_dir" --target nvfipc_gpu_tests --parallel "$(nproc 2>/dev/null || echo 4)" \
  >"$OUT/build.log" 2>&1 || { tail -n 60 "$OUT/build.log"; die "build failed (build.log)"; }
bin="$(find "$build_dir" -name nvfipc_gpu_tests -type f -perm -u+x -print -quit)"
[ -n "$bin" ] || die "nvfipc_gpu_tests was not built"
say "-- binary: $bin"

# ---- run -------------------------------------------------------------------------------------
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' \
    2>/dev/null || echo $((20000 + RANDOM % 20000))
}

filter_args=()
if [ -n "${NVFIPC_GPU_GTEST_FILTER:-}" ]; then filter_args=(--gtest_filter="$NVFIPC_GPU_GTEST_FILTER"); fi

failures=0
: >"$OUT/timings.txt"
for np in $ranks_list; do
  port="$(free_port)"
  json_dir="$OUT/np$np"
  mkdir -p "$json_dir"
  rm -f "$json_dir"/rank*.json
  log="$OUT/np$np.log"
  say "== mpirun -np $np (store on 127.0.0.1:$port, timeout ${run_timeout}s) -> $log"
  start=$(date +%s)
  set +e
  timeout --kill-after=20 "$run_timeout" \
    mpirun --allow-run-as-root --oversubscribe -np "$np" --tag-output \
      -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
      -x NVFIPC_GPU_JSON_DIR="$json_dir" -x NVFIPC_TIMEOUT_MS=120000 \
      -x NVFIPC_GPU_TEST_TIMEOUT_MS=60000 -x NVFIPC_GPU_DEVICE_MEMORY="${NVFIPC_GPU_DEVICE_MEMORY:-}" \
      -x LD_LIBRARY_PATH="$lib_dir:${LD_LIBRARY_PATH:-}" \
      "$bin" --gtest_color=no "${filter_args[@]}" >"$log" 2>&1
  rc=$?
  set -e
  took=$(($(date +%s) - start))
  grep -h "NVFIPC_TIMING" "$log" | sed 's/^.*NVFIPC_TIMING /np='"$np"' /' >>"$OUT/timings.txt" || true
  passed=$(grep -c "\[  PASSED  \]" "$log" || true)
  failed_lines=$(grep -h "\[  FAILED  \] [A-Za-z]" "$log" | sed 's/^.*\[  FAILED  \] //' | sort -u || true)
  ranks_json=$(find "$json_dir" -name 'rank*.json' | wc -l || true)
  if [ "$rc" -eq 0 ]; then
    say "-- np=$np: OK in ${took}s ($passed of $np ranks report PASSED; $ranks_json JSON reports)"
    { grep -h "\[  PASSED  \]\|\[  SKIPPED \] [0-9]" "$log" || true; } | sed 's/^\[[0-9,]*\]<stdout>://' |
      sort | uniq -c | sed 's/^/   /' | tee -a "$summary"
  else
    failures=$((failures + 1))
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      say "-- np=$np: TIMED OUT after ${took}s (rc $rc)"
    else
      say "-- np=$np: FAILED (rc $rc) after ${took}s"
    fi
    if [ -n "$failed_lines" ]; then
      echo "$failed_lines" | sed 's/^/   failed: /' | tee -a "$summary"
    fi
    echo "   last lines of $log:" | tee -a "$summary"
    tail -n 40 "$log" | sed 's/^/   | /' | tee -a "$summary"
  fi
done

say "== timings (microseconds; no assertions)"
sort "$OUT/timings.txt" | sed 's/^/   /' | tee -a "$summary"
if [ "$failures" -ne 0 ]; then
  die "$failures of the mpirun runs failed (logs in $OUT)"
fi
say "== ALL GPU SUITES PASSED"
