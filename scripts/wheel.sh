#!/usr/bin/env bash
# Builds the Python wheel (nvfuser-ipc) from the output of `cargo build --release`, and prints
# its path on stdout (everything else goes to stderr):
#
#   cargo build --release && bash scripts/wheel.sh [OUT_DIR]     # default build/wheel/dist
#
# 1. Stages the tree `cmake --install` makes (lib/libnvfuser_ipc.so, lib/cmake/nvfuser_ipc,
#    lib/pkgconfig/nvfuser-ipc.pc, include/*.h, *.hpp) into python/nvfuser_ipc, from the
#    already built target/release/libnvfuser_ipc.so (NVFIPC_PREBUILT_LIB_DIR: no second cargo
#    build of the library).
# 2. Runs maturin (pinned, from a cached venv: ~/.cache/nvfuser-ipc/venv-maturin, or
#    NVFIPC_MATURIN_VENV) with pyproject.toml: `bindings = "bin"` puts nvfipc in the wheel's
#    scripts, reusing target/release (cargo finds nothing to rebuild).
# 3. Strips the debug information (the release profile's line tables, debug = 1) from both
#    binaries: the library before maturin packs it, nvfipc by unpacking the wheel, stripping
#    and packing it again (`wheel pack` writes the new RECORD). Symbols stay: the library's
#    exported C functions, and function names for backtraces. The wheel is about 3 MB
#    (scripts/checks/wheel-check.sh fails it over 5 MB); unstripped it was 9.9 MB.
#
# manylinux: the wheel is tagged manylinux_2_34 (pyproject.toml), the newest glibc symbol
# version the library and nvfipc need when built against glibc 2.36 (Debian 12); maturin's
# auditwheel check fails the build if they come to need more. An older tag (manylinux_2_28,
# for RHEL 8) needs a build against an older glibc (the manylinux_2_28 container, or
# `maturin build --zig`), which this machine does not have.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/wheel/dist}"
log() { echo "wheel: $*" >&2; }

lib=target/release/libnvfuser_ipc.so
[ -f "$lib" ] || { log "$lib is missing: run cargo build --release first"; exit 1; }

stage=python/nvfuser_ipc
rm -rf "$stage/lib" "$stage/include" build/wheel/cmake
# nvfipc goes in as the wheel's script (maturin), not into the package's bin/; the .pc file's
# paths are relative to the file, since pip installs the package wherever it is asked to.
cmake -S . -B build/wheel/cmake -DNVFIPC_PREBUILT_LIB_DIR="$PWD/target/release" \
      -DNVFIPC_BUILD_TESTS=OFF -DNVFIPC_BUILD_CLI=OFF -DNVFIPC_PC_RELOCATABLE=ON \
      -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_INSTALL_INCLUDEDIR=include >/dev/null
cmake --install build/wheel/cmake --prefix "$stage" >/dev/null
# The release profile keeps line tables (debug = 1) for backtraces; the wheel's copy goes
# without them (20 MB -> about 3 MB); symbols stay.
strip --strip-debug "$stage/lib/libnvfuser_ipc.so"
# maturin's auditwheel check covers the nvfipc binary it builds; the library is checked here.
tag_glibc=2.34
need=$(objdump -T "$stage/lib/libnvfuser_ipc.so" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' \
       | sort -uV | tail -1)
if [ "$(printf '%s\n%s\n' "$need" "$tag_glibc" | sort -V | tail -1)" != "$tag_glibc" ]; then
  log "libnvfuser_ipc.so needs glibc $need, newer than the wheel's tag manylinux_${tag_glibc/./_}"
  exit 1
fi
log "staged $(find "$stage/lib" "$stage/include" -type f | wc -l) files under $stage"

venv="${NVFIPC_MATURIN_VENV:-$HOME/.cache/nvfuser-ipc/venv-maturin}"
if ! [ -x "$venv/bin/maturin" ] || ! [ -x "$venv/bin/wheel" ]; then
  log "installing maturin and wheel into $venv"
  [ -x "$venv/bin/pip" ] || python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "maturin==1.16.0" "wheel==0.45.1"
fi
rm -rf "$out"
"$venv/bin/maturin" build --release --out "$out" >&2
# maturin packs target/release/nvfipc as it is (34 MB of it line tables): strip the wheel's copy.
built="$(ls "$out"/*.whl)"
unpacked=build/wheel/unpacked
rm -rf "$unpacked"
"$venv/bin/wheel" unpack --dest "$unpacked" "$built" >/dev/null
strip --strip-debug "$unpacked"/*/*.data/scripts/nvfipc
rm "$built"
"$venv/bin/wheel" pack --dest-dir "$out" "$unpacked"/* >/dev/null
rm -rf "$unpacked"
log "$(ls "$out"/*.whl): $(($(stat -c %s "$out"/*.whl) / 1000)) kB"
ls "$out"/*.whl
