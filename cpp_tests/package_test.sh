#!/usr/bin/env bash
# Builds and runs cpp_tests/package_consumer against nvfuser_ipc in both supported ways.
# Usage: package_test.sh install      <nvfuser_ipc build dir> <source dir> <work dir>
#        package_test.sh subdirectory <dir of the built libnvfuser_ipc.so> <source dir> <work dir>
set -euo pipefail
mode="$1" input="$2" source_dir="$3" work="$4"
rm -rf "$work"
mkdir -p "$work"
consumer="$source_dir/cpp_tests/package_consumer"
case "$mode" in
  install)
    cmake --install "$input" --prefix "$work/prefix" >/dev/null
    cmake -S "$consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
    ;;
  subdirectory)
    # Reuse the library built for the tests so that this does not run cargo again.
    cmake -S "$consumer" -B "$work/build" -DNVFIPC_SOURCE_DIR="$source_dir" \
          -DNVFIPC_PREBUILT_LIB_DIR="$input" >/dev/null
    ;;
  *) echo "unknown mode $mode" >&2; exit 2 ;;
esac
cmake --build "$work/build" >/dev/null
"$work/build/consumer"
