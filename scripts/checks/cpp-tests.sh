#!/usr/bin/env bash
# Configures, builds and runs the C/C++ test suites (CMake + GoogleTest) of the C API.
# Usage: scripts/checks/cpp-tests.sh [build-dir]   (default: build/cpp)
# Environment: NVFIPC_CARGO_PROFILE (default release), NVFIPC_PREBUILT_LIB_DIR (skip cargo),
# CTEST_PARALLEL_LEVEL (default 2), extra configure arguments in NVFIPC_CMAKE_ARGS.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build_dir="${1:-$root/build/cpp}"

configure_args=(-S "$root" -B "$build_dir" -DNVFIPC_BUILD_TESTS=ON
                -DNVFIPC_CARGO_PROFILE="${NVFIPC_CARGO_PROFILE:-release}")
if [ -n "${NVFIPC_PREBUILT_LIB_DIR:-}" ]; then
  # The suites need no nvfipc, which that directory may lack.
  configure_args+=(-DNVFIPC_PREBUILT_LIB_DIR="$NVFIPC_PREBUILT_LIB_DIR" -DNVFIPC_BUILD_CLI=OFF)
fi
# shellcheck disable=SC2206
configure_args+=(${NVFIPC_CMAKE_ARGS:-})

echo "== cmake configure ($build_dir)"
cmake "${configure_args[@]}"
echo "== cmake build"
cmake --build "$build_dir" --parallel "$(nproc 2>/dev/null || echo 2)"
echo "== ctest"
cd "$build_dir"
ctest --output-on-failure --parallel "${CTEST_PARALLEL_LEVEL:-2}" --timeout 180
