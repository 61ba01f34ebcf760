#!/usr/bin/env bash
# The installed pkg-config file, as a plain Makefile or Meson user meets it:
# 1. `cmake --install` to a temporary prefix: the .pc file lies beside the CMake package, names
#    the prefix it was installed to (absolute, with no `..`), carries Cargo.toml's version, and a
#    C program compiled and linked with only `pkg-config --cflags --libs nvfuser-ipc` (and an
#    rpath to its libdir) runs as two ranks under the installed `bin/nvfipc launch`, finding the
#    library through a RUNPATH that is the prefix's lib directory;
# 2. with -DNVFIPC_PC_RELOCATABLE=ON (as the Python wheel installs it) the tree may move: the
#    moved .pc file still leads to the library and headers.
# Needs target/release/libnvfuser_ipc.so and target/release/nvfipc (cargo build --release).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
for f in target/release/libnvfuser_ipc.so target/release/nvfipc; do
  [ -f "$f" ] || { echo "pkgconfig-check: $f missing: run cargo build --release" >&2; exit 1; }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "pkgconfig-check: $*" >&2; exit 1; }

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

# install BUILD_DIR PREFIX [CONFIGURE ARGS...]: the package, from the prebuilt target/release.
install() {
  local build="$1" prefix="$2"
  shift 2
  cmake -S "$root" -B "$build" -DNVFIPC_PREBUILT_LIB_DIR="$root/target/release" "$@" >/dev/null
  cmake --install "$build" --prefix "$prefix" >/dev/null
}

echo "== cmake --install to a temporary prefix"
prefix="$tmp/installed"
install "$tmp/build" "$prefix"
pc="$(find "$prefix" -name nvfuser-ipc.pc)"
[ -n "$pc" ] || fail "no nvfuser-ipc.pc installed"
# Beside the CMake package: <libdir>/pkgconfig and <libdir>/cmake/nvfuser_ipc.
libdir="$(dirname "$(dirname "$pc")")"
[ -f "$libdir/cmake/nvfuser_ipc/nvfuser_ipcConfig.cmake" ] || fail "$pc is not beside the CMake package"
PKG_CONFIG_PATH="$(dirname "$pc")"
export PKG_CONFIG_PATH
flags="$(pkg-config --cflags --libs nvfuser-ipc | xargs)"
echo "pkg-config --cflags --libs nvfuser-ipc: $flags"
[ "$flags" = "-I$prefix/include -L$libdir -lnvfuser_ipc" ] || fail "expected the install prefix's paths"
[ "$(pkg-config --variable=libdir nvfuser-ipc)" = "$libdir" ] || fail "libdir is not $libdir"
version="$(pkg-config --modversion nvfuser-ipc)"
grep -q "^version = \"$version\"" Cargo.toml || fail "version $version is not Cargo.toml's"

echo "== cc pc_check.c \$(pkg-config --cflags --libs nvfuser-ipc) -Wl,-rpath,<libdir>"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror "$tmp/pc_check.c" $flags \
   -Wl,-rpath,"$(pkg-config --variable=libdir nvfuser-ipc)" -o "$tmp/pc_check"
runpath="$(readelf -dW "$tmp/pc_check" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')"
[ "$runpath" = "$libdir" ] || fail "RUNPATH is '$runpath', not $libdir"
"$prefix/bin/nvfipc" launch -n 2 -- "$tmp/pc_check" | tee "$tmp/out"
[ "$(grep -c 'linked through pkg-config' "$tmp/out")" -eq 2 ] || fail "the program did not run on both ranks"

echo "== relocatable (-DNVFIPC_PC_RELOCATABLE=ON, as the wheel): the tree moved after install"
install "$tmp/build-relocatable" "$tmp/relocatable" -DNVFIPC_PC_RELOCATABLE=ON -DNVFIPC_BUILD_CLI=OFF
mv "$tmp/relocatable" "$tmp/moved"
pc="$(find "$tmp/moved" -name nvfuser-ipc.pc)"
PKG_CONFIG_PATH="$(dirname "$pc")"
flags="$(pkg-config --cflags --libs nvfuser-ipc | xargs)"
echo "pkg-config --cflags --libs nvfuser-ipc: $flags"
# shellcheck disable=SC2086
cc -std=c11 -Wall -Werror "$tmp/pc_check.c" $flags -o "$tmp/pc_check_moved"
LD_LIBRARY_PATH="$(pkg-config --variable=libdir nvfuser-ipc)" \
  "$prefix/bin/nvfipc" launch -n 2 -- "$tmp/pc_check_moved" | tee "$tmp/out"
[ "$(grep -c 'linked through pkg-config' "$tmp/out")" -eq 2 ] || fail "the moved tree's program did not run on both ranks"
echo "== pkg-config file works"
