#!/usr/bin/env bash
# Prepares, where cargo and the network are, what scripts/nvfuser/suite.sh needs on a GPU machine
# that has neither: nvFuser's sources with the submodules its build adds unconditionally, packed,
# and a stripped libnvfuser_ipc.so. Both go to .nvf/ (ignored by git), to be copied to the GPU
# machine beside the repository.
#
# Usage: scripts/nvfuser/prepare.sh NVFUSER_CHECKOUT
#   NVFUSER_CHECKOUT  NVIDIA/Fuser at 3fe1c32124ea83f90253496cecbe5becf46c9df0 with
#                     third_party/{flatbuffers,googletest,benchmark} filled in (e.g.
#                     `git clone --recursive`, or `git archive` of each submodule commit)
#
# nvFuser's own build compiles flatc from third_party/flatbuffers and generates
# csrc/serde/fusion_cache_generated.h itself, so no generated file is packed.
set -euo pipefail
cd "$(dirname "$0")/../.."
die() { echo "nvfuser-prepare: FAILED: $*" >&2; exit 1; }
[ $# -eq 1 ] || die "usage: $0 NVFUSER_CHECKOUT"
fuser="$(cd "$1" && pwd)" || die "no such directory: $1"
for f in CMakeLists.txt csrc/multidevice/ipc_handle.cpp third_party/flatbuffers/CMakeLists.txt \
    third_party/googletest/CMakeLists.txt third_party/benchmark/CMakeLists.txt; do
  [ -f "$fuser/$f" ] || die "$fuser/$f missing (sources and submodules flatbuffers, googletest, benchmark)"
done
mkdir -p .nvf/lib
grep -qxF '/.nvf/' .git/info/exclude 2>/dev/null || echo '/.nvf/' >>.git/info/exclude
# The CLA and generated files are not needed to build (doc/ is: tests link to files in it).
tar -C "$fuser" --exclude='*.pdf' --exclude=./csrc/serde/fusion_cache_generated.h \
  -cJf .nvf/nvfuser-seed.tar.xz .
cargo build --release --lib
strip --strip-debug -o .nvf/lib/libnvfuser_ipc.so target/release/libnvfuser_ipc.so
echo "nvfuser-prepare: .nvf/nvfuser-seed.tar.xz ($(du -h .nvf/nvfuser-seed.tar.xz | cut -f1)), .nvf/lib/libnvfuser_ipc.so ($(du -h .nvf/lib/libnvfuser_ipc.so | cut -f1))"
