#!/usr/bin/env bash
# Runs what README.md prints, as printed:
# 1. the C example: the code block after the marker `<!-- readme-check: ring.c -->` is written to
#    ring.c, and the shell block after `<!-- readme-check: run -->` is run from the repository
#    root (with `set -e`);
# 2. the install: the block after `<!-- readme-check: install -->` (configure, build, install,
#    `bin/nvfipc --version`) into a fresh temporary prefix in place of /opt/nvfipc, in a build
#    directory that did not exist before (removed afterwards);
# 3. pkg-config: the block after `<!-- readme-check: pkg-config -->` builds ring.c against that
#    prefix alone and runs it under the installed nvfipc;
# 4. the README's word that configuring with NVFIPC_BUILD_TESTS=ON and no GoogleTest stops and
#    says so.
# ring.c and the programs built from it are removed afterwards. Fails when a block is missing,
# when a command fails, or when the program reports a failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
readme_prefix=/opt/nvfipc

block() { # the fenced block after marker $1
    awk -v marker="<!-- readme-check: $1 -->" '
        $0 == marker { found = 1; next }
        found == 1 && /^```/ { found = 2; next }
        found == 2 && /^```/ { exit }
        found == 2 { print }
    ' README.md
}

fail() { echo "readme-check: $*" >&2; exit 1; }

c_code="$(block ring.c)"
commands="$(block run)"
install_commands="$(block install)"
pc_commands="$(block pkg-config)"
for b in c_code commands install_commands pc_commands; do
    [ -n "${!b}" ] || fail "README.md lacks the ring.c, run, install or pkg-config block"
done
for b in install_commands pc_commands; do
    grep -q "$readme_prefix" <<<"${!b}" || fail "the README's $b do not install to $readme_prefix"
done
# The install block's build directory (`cmake -B DIR`), made here and removed afterwards.
build_dir="$(sed -n 's/.* -B \([^ ]*\).*/\1/p' <<<"$install_commands" | head -n 1)"
[ -n "$build_dir" ] || fail "the install block names no build directory (cmake -B DIR)"
for f in ring.c ring "$build_dir"; do
    if [ -e "$f" ]; then
        echo "readme-check: ./$f exists; refusing to overwrite it" >&2
        exit 1
    fi
done
prefix="$(mktemp -d)/prefix"
trap 'rm -rf ring.c ring "$build_dir" "$(dirname "$prefix")"' EXIT
printf '%s\n' "$c_code" > ring.c

echo "== README example: ring.c ($(wc -l < ring.c) lines), then:"
printf '%s\n' "$commands"
bash -euo pipefail -c "$commands"
echo "== README example ran as printed"
rm -f ring

echo "== README install, to $prefix in place of $readme_prefix:"
printf '%s\n' "$install_commands"
bash -euo pipefail -c "${install_commands//$readme_prefix/$prefix}"
version="$("$prefix/bin/nvfipc" --version)"
grep -q "^version = \"${version#nvfipc }\"" Cargo.toml || fail "installed $version is not Cargo.toml's version"

echo "== README pkg-config, against $prefix:"
printf '%s\n' "$pc_commands"
bash -euo pipefail -c "${pc_commands//$readme_prefix/$prefix}"
# ldd's output is read whole first: `ldd | grep -q` under pipefail fails at random when grep
# exits on its match before ldd has written everything (SIGPIPE).
loaded="$(ldd ring)"
grep -q "=> $prefix/lib/libnvfuser_ipc.so" <<<"$loaded" || {
    echo "$loaded" >&2
    fail "ring does not load the installed library"
}
echo "== README install and pkg-config ran as printed"

echo "== configure with NVFIPC_BUILD_TESTS=ON and no GoogleTest"
scratch="$(dirname "$prefix")"
if cmake -S . -B "$scratch/no-gtest" -DNVFIPC_BUILD_TESTS=ON -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON \
        >"$scratch/no-gtest.log" 2>&1 || ! grep -q "GoogleTest was not found" "$scratch/no-gtest.log"; then
    cat "$scratch/no-gtest.log" >&2
    fail "configure did not stop saying GoogleTest was not found"
fi
echo "== it stops and says so"
