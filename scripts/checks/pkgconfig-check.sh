#!/usr/bin/env bash
# The installed pkg-config file, as a plain Makefile or Meson user meets it: installs the package
# (`cmake --install`) to a temporary prefix, moves the tree elsewhere (the .pc file is
# relocatable), then compiles and links a C program with only `pkg-config --cflags --libs
# nvfuser-ipc` and runs it as two ranks under `nvfipc launch`.
# Needs target/release/libnvfuser_ipc.so and target/release/nvfipc (cargo build --release).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
for f in target/release/libnvfuser_ipc.so target/release/nvfipc; do
  [ -f "$f" ] || { echo "pkgconfig-check: $f missing: run cargo build --release" >&2; exit 1; }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

echo "== cmake --install to a temporary prefix"
cmake -S "$root" -B "$tmp/build" -DNVFIPC_BUILD_TESTS=OFF \
      -DNVFIPC_PREBUILT_LIB_DIR="$root/target/release" >/dev/null
cmake --install "$tmp/build" --prefix "$tmp/installed" >/dev/null
pc="$(find "$tmp/installed" -name nvfuser-ipc.pc)"
[ -n "$pc" ] || { echo "pkgconfig-check: no nvfuser-ipc.pc installed" >&2; exit 1; }
# Beside the CMake package: <libdir>/pkgconfig and <libdir>/cmake/nvfuser_ipc.
libdir="$(dirname "$(dirname "$pc")")"
[ -f "$libdir/cmake/nvfuser_ipc/nvfuser_ipcConfig.cmake" ] || {
  echo "pkgconfig-check: $pc is not beside the CMake package" >&2; exit 1; }
mv "$tmp/installed" "$tmp/moved"
pcdir="$(dirname "${pc/$tmp\/installed/$tmp/moved}")"
export PKG_CONFIG_PATH="$pcdir"

flags="$(pkg-config --cflags --libs nvfuser-ipc)"
echo "pkg-config --cflags --libs nvfuser-ipc: $flags"
version="$(pkg-config --modversion nvfuser-ipc)"
grep -q "^version = \"$version\"" Cargo.toml || {
  echo "pkgconfig-check: version $version is not Cargo.toml's" >&2; exit 1; }

cat > "$tmp/pc_check.c" <<'C'
#include <nvfuser_ipc.h>
#include <stdio.h>

int main(void) {
  nvfipc_context* ctx = NULL;
  if (nvfipc_context_from_env(&ctx) != NVFIPC_STATUS_OK) {
    fprintf(stderr, "nvfipc_context_from_env: %s\n", nvfipc_last_error_message());
    return 1;
  }
  int64_t rank = -1;
  if (nvfipc_context_rank(ctx, &rank) != NVFIPC_STATUS_OK ||
      nvfipc_barrier(ctx, NULL, 0, -1) != NVFIPC_STATUS_OK) {
    fprintf(stderr, "rank %lld: %s\n", (long long)rank, nvfipc_last_error_message());
    return 1;
  }
  printf("rank %lld linked through pkg-config\n", (long long)rank);
  return nvfipc_context_free(ctx) == NVFIPC_STATUS_OK ? 0 : 1;
}
C
echo "== cc pc_check.c \$(pkg-config --cflags --libs nvfuser-ipc)"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror "$tmp/pc_check.c" $flags -o "$tmp/pc_check"
LD_LIBRARY_PATH="$(pkg-config --variable=libdir nvfuser-ipc)" target/release/nvfipc launch -n 2 -- "$tmp/pc_check" \
  | tee "$tmp/out"
[ "$(grep -c 'linked through pkg-config' "$tmp/out")" -eq 2 ] || {
  echo "pkgconfig-check: the program did not run on both ranks" >&2; exit 1; }
echo "== pkg-config file works"
