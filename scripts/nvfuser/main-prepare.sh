#!/usr/bin/env bash
# Prepares, where cargo and the network are, what scripts/nvfuser/main-suite.sh needs on a GPU
# machine that has neither, for nvFuser main (NVIDIA/Fuser 81c4b22fd750d377d69e24928c32233162f6b2bd).
# Everything goes to .nvf-main/ (ignored through .git/info/exclude), kept compressed and small
# (tens of MiB), to be copied to the GPU machine beside the repository.
#
# Usage: scripts/nvfuser/main-prepare.sh NVFUSER_CHECKOUT [LLVM_ROOT]
#   NVFUSER_CHECKOUT  NVIDIA/Fuser at 81c4b22fd with third_party/{flatbuffers,googletest,benchmark}
#                     filled in (cutlass is not needed: the suite configures NVFUSER_DISABLE_CUTLASS)
#   LLVM_ROOT         a directory holding Debian's llvm-19-dev, libllvm19 and libz3-4 extracted
#                     (`apt-get download llvm-19-dev libllvm19 libz3-4` and `dpkg-deb -x` each into
#                     it); downloaded into .nvf-main/debs when not given
# Environment:
#   IPC_TREE  the nvfuser-ipc tree whose library and drop-in are carried (default: this checkout).
#             Give a clean worktree of the commit under test (`git worktree add DIR HEAD`) so that
#             uncommitted edits elsewhere do not leak in; its HEAD is `git archive`d, so only
#             committed files travel, and `cargo build --release --lib` runs there.
#
# Outputs in .nvf-main/:
#   nvfuser-main.tar.xz   nvFuser's sources and the three submodules (no PDFs, no cutlass)
#   llvm19.tar.xz         LLVM 19's headers, libLLVM.so.19.1, libz3.so.4 and a small CMake config
#                         (lib/cmake/llvm/LLVMConfig.cmake) that links the shared libLLVM: nvFuser
#                         main links an LLVM JIT (host_ir/jit*.cpp), LLVM >= 18, and the GPU
#                         machine only has LLVM 16; Debian's own config would link ~300 MB of
#                         static archives
#   ipc-src.tar.xz        `git archive` of IPC_TREE's HEAD (CMakeLists.txt, include/, the drop-in
#                         integrations/nvfuser/main/ipc_handle.{h,cpp}, nvfuser_ipc.cmake)
#   ipc-commit            that commit
#   lib/libnvfuser_ipc.so IPC_TREE's release library, debug info stripped
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
die() { echo "nvfuser-main-prepare: FAILED: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || die "usage: $0 NVFUSER_CHECKOUT [LLVM_ROOT]"
fuser="$(cd "$1" && pwd)" || die "no such directory: $1"
for f in CMakeLists.txt csrc/multidevice/ipc_handle.cpp csrc/multidevice/symmetric_tensor.cpp \
    csrc/host_ir/jit.cpp third_party/flatbuffers/CMakeLists.txt \
    third_party/googletest/CMakeLists.txt third_party/benchmark/CMakeLists.txt; do
  [ -f "$fuser/$f" ] || die "$fuser/$f missing (main's sources and submodules flatbuffers, googletest, benchmark)"
done
ipc_tree="$(cd "${IPC_TREE:-$repo}" && pwd)"
out="$repo/.nvf-main"
mkdir -p "$out/lib"
grep -qxF '/.nvf-main/' "$repo/.git/info/exclude" 2>/dev/null ||
  echo '/.nvf-main/' >>"$(git -C "$repo" rev-parse --git-common-dir)/info/exclude"

# ---- nvFuser ---------------------------------------------------------------------------------
tar -C "$fuser" --exclude='*.pdf' --exclude=./third_party/cutlass --exclude=./.git \
  -cf - . | xz -T2 -6 >"$out/nvfuser-main.tar.xz"

# ---- LLVM 19 -----------------------------------------------------------------------------------
llvm_root="${2:-}"
if [ -z "$llvm_root" ]; then
  llvm_root="$out/debs/root"
  if [ ! -f "$llvm_root/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1" ]; then
    mkdir -p "$out/debs"
    (cd "$out/debs" && apt-get download llvm-19-dev libllvm19 libz3-4) || die "apt-get download (run apt-get update first)"
    for d in "$out"/debs/*.deb; do dpkg-deb -x "$d" "$llvm_root"; done
  fi
fi
lib_llvm="$llvm_root/usr/lib/x86_64-linux-gnu/libLLVM.so.19.1"
lib_z3="$llvm_root/usr/lib/x86_64-linux-gnu/libz3.so.4"
inc_llvm="$llvm_root/usr/include/llvm-19"
inc_llvm_c="$llvm_root/usr/include/llvm-c-19"
for f in "$lib_llvm" "$lib_z3" "$inc_llvm/llvm/ExecutionEngine/Orc/LLJIT.h" "$inc_llvm_c/llvm-c/Core.h"; do
  [ -e "$f" ] || die "$f missing under LLVM_ROOT (llvm-19-dev, libllvm19, libz3-4 extracted)"
done
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
L="$stage/llvm19"
mkdir -p "$L/include" "$L/lib/cmake/llvm"
cp -a "$inc_llvm/llvm" "$inc_llvm_c/llvm-c" "$L/include/"
cp "$lib_llvm" "$lib_z3" "$L/lib/"
ln -s libLLVM.so.19.1 "$L/lib/libLLVM.so"
llvm_version="$(sed -n 's/^#define LLVM_VERSION_STRING "\([0-9.]*\).*/\1/p' "$L/include/llvm/Config/llvm-config.h")"
[ -n "$llvm_version" ] || die "no LLVM_VERSION_STRING in llvm/Config/llvm-config.h"
cat >"$L/lib/cmake/llvm/LLVMConfig.cmake" <<EOF
# Written by nvfuser-ipc's scripts/nvfuser/main-prepare.sh: LLVM $llvm_version (Debian's headers
# and shared libLLVM) for nvFuser's cmake/deps/handle_llvm.cmake. Every component maps to the one
# shared library, so nothing links LLVM's static archives.
get_filename_component(_nvf_llvm_root "\${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
set(LLVM_FOUND TRUE)
set(LLVM_PACKAGE_VERSION $llvm_version)
set(LLVM_VERSION $llvm_version)
string(REPLACE "." ";" _nvf_llvm_v "$llvm_version")
list(GET _nvf_llvm_v 0 LLVM_VERSION_MAJOR)
list(GET _nvf_llvm_v 1 LLVM_VERSION_MINOR)
list(GET _nvf_llvm_v 2 LLVM_VERSION_PATCH)
set(LLVM_INCLUDE_DIRS "\${_nvf_llvm_root}/include")
set(LLVM_LIBRARY_DIRS "\${_nvf_llvm_root}/lib")
set(LLVM_DEFINITIONS -D_GNU_SOURCE -D__STDC_CONSTANT_MACROS -D__STDC_FORMAT_MACROS -D__STDC_LIMIT_MACROS)
set(LLVM_LINK_LLVM_DYLIB ON)
function(llvm_map_components_to_libnames out_var)
  set(\${out_var} "\${_nvf_llvm_root}/lib/libLLVM.so" PARENT_SCOPE)
endfunction()
EOF
cat >"$L/lib/cmake/llvm/LLVMConfigVersion.cmake" <<EOF
set(PACKAGE_VERSION $llvm_version)
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION)
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
EOF
tar -C "$stage" -cf - llvm19 | xz -T2 -6 >"$out/llvm19.tar.xz"

# ---- nvfuser-ipc -------------------------------------------------------------------------------
commit="$(git -C "$ipc_tree" rev-parse HEAD)"
git -C "$ipc_tree" archive --format=tar HEAD | xz -T2 -6 >"$out/ipc-src.tar.xz"
echo "$commit" >"$out/ipc-commit"
(cd "$ipc_tree" && cargo build --release --lib) || die "cargo build in $ipc_tree"
strip --strip-debug -o "$out/lib/libnvfuser_ipc.so" "$ipc_tree/target/release/libnvfuser_ipc.so"
if [ -n "$(git -C "$ipc_tree" status --porcelain --untracked-files=no -- src Cargo.toml Cargo.lock build.rs include)" ]; then
  echo "nvfuser-main-prepare: WARNING: $ipc_tree has uncommitted changes in the library's sources; the .so was built from them, ipc-src.tar.xz holds HEAD" >&2
fi

echo "nvfuser-main-prepare: in $out (nvfuser-ipc $commit):"
du -h "$out"/*.tar.xz "$out/lib/libnvfuser_ipc.so"
echo "nvfuser-main-prepare: carry total $(du -cb "$out"/*.tar.xz "$out/ipc-commit" "$out/lib/libnvfuser_ipc.so" | tail -1 | cut -f1) bytes"
