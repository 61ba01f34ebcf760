#!/usr/bin/env bash
# Builds the wheel from target/release (scripts/wheel.sh), installs it into a fresh venv with
# no cargo and no source tree on its paths, and checks what it carries:
# - at most 5 MB, its two binaries without debug information, the library's C functions
#   exported;
# - `python -m nvfuser_ipc --cmake-prefix` + find_package(nvfuser_ipc): cpp_tests/package_consumer
#   built and run; integrations/nvfuser/nvfuser_ipc.cmake included by a stand-in of nvFuser's
#   targets; pkg-config finds nvfuser-ipc.pc;
# - the `nvfipc` script (`nvfipc doctor --local --json` parses);
# - the Python API across processes with host buffers (tests/python/host_exchange.py under
#   `nvfipc launch -n 3`), the README's host example (examples/python/host_exchange.py under
#   `nvfipc launch -n 2`, as printed there), the host-callback store bridge
#   (tests/python/store_bridge.py) and misuse of the API (tests/python/api_misuse.py; again with
#   real torch tensors when NVFIPC_PYTHON names a python with torch, as scripts/test.sh sets it).
set -euo pipefail
cd "$(dirname "$0")/../.."
src="$PWD"
work="${1:-build/wheel/check}"
rm -rf "$work"
mkdir -p "$work"
work="$(cd "$work" && pwd)"

wheel="$(bash scripts/wheel.sh build/wheel/dist)"
size=$(stat -c %s "$wheel")
echo "== $wheel: $((size / 1000)) kB"
if [ "$size" -gt 5000000 ]; then
  echo "the wheel is $size bytes, over 5 MB: scripts/wheel.sh strips both binaries" >&2
  exit 1
fi
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check --no-index "$wheel"
py="$work/venv/bin/python"
cd "$work"   # nothing of the source tree on sys.path

prefix="$("$py" -m nvfuser_ipc --cmake-prefix)"
case "$prefix" in "$work/venv/"*) ;; *) echo "cmake prefix $prefix is not in the venv" >&2; exit 1 ;; esac
lib="$prefix/lib/libnvfuser_ipc.so"
for binary in "$work/venv/bin/nvfipc" "$lib"; do
  # Each tool's output is read whole before grep -q sees it: under pipefail, grep -q exiting on
  # its match may kill the writer (SIGPIPE) and fail the pipeline at random.
  if grep -qE '\.debug_(info|line) ' <<<"$(readelf -SW "$binary")"; then
    echo "$binary carries debug information: scripts/wheel.sh strips it" >&2
    exit 1
  fi
done
grep -q ' T nvfipc_context_from_env$' <<<"$(nm -D --defined-only "$lib")" || {
  echo "$lib does not export the C API (nvfipc_context_from_env)" >&2; exit 1; }
echo "== find_package(nvfuser_ipc) from the wheel ($prefix)"
cmake -S "$src/cpp_tests/package_consumer" -B consumer -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build consumer >/dev/null
./consumer/consumer

echo "== integrations/nvfuser/nvfuser_ipc.cmake from the wheel"
mkdir -p fake_nvfuser
cat > fake_nvfuser/CMakeLists.txt <<CMAKE
cmake_minimum_required(VERSION 3.18)
project(fake_nvfuser LANGUAGES CXX)
file(WRITE \${CMAKE_BINARY_DIR}/ipc_handle.cpp
     "#include <nvfuser_ipc.hpp>\nconst char* v() { return nvfipc_version(); }\n")
add_library(codegen_internal OBJECT \${CMAKE_BINARY_DIR}/ipc_handle.cpp)
set_target_properties(codegen_internal PROPERTIES POSITION_INDEPENDENT_CODE ON CXX_STANDARD 17)
add_library(nvfuser_codegen SHARED \$<TARGET_OBJECTS:codegen_internal>)
include("$src/integrations/nvfuser/nvfuser_ipc.cmake")
CMAKE
cmake -S fake_nvfuser -B fake_nvfuser/build -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build fake_nvfuser/build >/dev/null
echo "nvFuser's targets link nvfuser_ipc::nvfuser_ipc from the wheel"

echo "== pkg-config from the wheel"
PKG_CONFIG_PATH="$("$py" -m nvfuser_ipc --pkgconfig)"
export PKG_CONFIG_PATH
pkg-config --modversion nvfuser-ipc
# Its paths are relative to the .pc file, wherever pip put it.
[ -f "$(pkg-config --variable=libdir nvfuser-ipc)/libnvfuser_ipc.so" ] || {
  echo "pkg-config's libdir from the wheel has no libnvfuser_ipc.so" >&2; exit 1; }
unset PKG_CONFIG_PATH

echo "== the nvfipc script"
"$work/venv/bin/nvfipc" --version
"$work/venv/bin/nvfipc" doctor --local --json >doctor.json || true
"$py" -c 'import json; r = json.load(open("doctor.json")); print("nvfipc doctor:", r["summary"])'

echo "== Python API: host buffers across 3 processes, the README's host example, the store bridge"
"$work/venv/bin/nvfipc" launch -n 3 -- "$py" "$src/tests/python/host_exchange.py" env
"$work/venv/bin/nvfipc" launch -n 2 -- "$py" "$src/examples/python/host_exchange.py"
"$py" "$src/tests/python/store_bridge.py"

echo "== Python API misuse: exceptions that say what is wrong, never a crash"
"$py" "$src/tests/python/api_misuse.py"
if [ -n "${NVFIPC_PYTHON:-}" ]; then
  # The package from the source tree over the wheel's library, in the python that has torch.
  lib="$("$py" -c 'import nvfuser_ipc; print(nvfuser_ipc.library_path())')"
  PYTHONPATH="$src/python" NVFIPC_LIBRARY="$lib" \
    "$NVFIPC_PYTHON" "$src/tests/python/api_misuse.py" --require-torch
fi
