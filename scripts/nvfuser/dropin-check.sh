#!/usr/bin/env bash
# Compiles the nvFuser drop-in (integrations/nvfuser/ipc_handle.{h,cpp}) against the real headers
# of an nvFuser checkout, the way nvFuser's CMake compiles codegen_internal: C++20, -Wall -Werror,
# hidden visibility, PIC, -DTORCH_CUDA_BUILD_MAIN_LIB, NVFUSER_DISTRIBUTED when torch has c10d,
# include dirs csrc/, lib/dynamic_type/src, python/, third_party/flatbuffers/include, torch's and
# CUDA's. Our ipc_handle.h shadows csrc/multidevice/ipc_handle.h through an overlay include dir
# placed first, so every caller of the header is compiled against it too: nvFuser's
# host_ir/executor.cpp and multidevice/cuda_p2p.cpp, its tests test_multidevice_host_ir.cpp,
# test_multidevice_communications.cpp and test_multidevice_ipc.cpp, and this repository's host-IR
# driver; their undefined IpcHandle* symbols are checked to be defined by our object. On CUDA 13
# headers nvFuser's own driver_api.h needs integrations/nvfuser/seed-compat/cuda13_pfn.h, which
# is force-included. Any file that does not compile fails the check. Nothing is stubbed.
#
# Usage: scripts/nvfuser/dropin-check.sh NVFUSER_CHECKOUT [OUT_DIR]
#   NVFUSER_CHECKOUT  an NVIDIA/Fuser source tree at 3fe1c32124ea83f90253496cecbe5becf46c9df0 (csrc/,
#                     lib/dynamic_type/, python/, tests/cpp/, third_party/flatbuffers/include and
#                     third_party/googletest are read)
#   OUT_DIR           where objects and logs go (default: $OUT or a temporary directory)
#
# Generated header: csrc/serde/fusion_cache_generated.h (nvFuser's build runs flatc on
# csrc/serde/fusion_cache.fbs). When it is missing and `flatc` (or $FLATC) is available it is
# generated into the checkout exactly as nvFuser's CMake does; otherwise the script stops and
# says so.
#
# Environment: PYTHON (python with torch; default python3), CUDA_HOME or CUDA_INCLUDE_DIR (CUDA
# headers; default: nvcc's, /usr/local/cuda, or the nvidia/cu*/include of torch's pip wheels),
# CXX (default g++), FLATC, EXTRA_INCLUDE_DIRS (':'-separated system include dirs).
set -euo pipefail

die() {
  echo "nvfuser-dropin-check: FAILED: $*" >&2
  exit 1
}
say() { echo "nvfuser-dropin-check: $*"; }

[ $# -ge 1 ] || die "usage: $0 NVFUSER_CHECKOUT [OUT_DIR]"
root="$(cd "$(dirname "$0")/../.." && pwd)"
fuser="$(cd "$1" && pwd)" || die "no such directory: $1"
out="${2:-${OUT:-$(mktemp -d)}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cxx="${CXX:-g++}"
python="${PYTHON:-python3}"

[ -f "$fuser/csrc/multidevice/ipc_handle.h" ] ||
  die "$fuser does not look like an nvFuser checkout (csrc/multidevice/ipc_handle.h missing)"
[ -f "$fuser/csrc/host_ir/executor.h" ] || die "$fuser/csrc/host_ir/executor.h missing"
[ -d "$fuser/tests/cpp" ] || die "$fuser/tests/cpp missing (the multidevice tests are compiled too)"
[ -f "$fuser/third_party/googletest/googletest/include/gtest/gtest.h" ] ||
  die "$fuser/third_party/googletest missing (nvFuser's googletest submodule; the tests need its headers)"

# ---- torch ------------------------------------------------------------------------------------
torch_info="$("$python" -W ignore -c 'import os, torch
print(os.path.dirname(torch.__file__))
print(int(torch._C._GLIBCXX_USE_CXX11_ABI))
print(torch.__version__)' 2>/dev/null)" || die "$python cannot import torch (set PYTHON)"
torch_dir="$(echo "$torch_info" | sed -n 1p)"
cxx11_abi="$(echo "$torch_info" | sed -n 2p)"
torch_version="$(echo "$torch_info" | sed -n 3p)"
say "torch $torch_version at $torch_dir (_GLIBCXX_USE_CXX11_ABI=$cxx11_abi)"

# ---- CUDA headers -----------------------------------------------------------------------------
cuda_inc="${CUDA_INCLUDE_DIR:-}"
if [ -z "$cuda_inc" ]; then
  for cand in "${CUDA_HOME:-}/include" "$(dirname "$(command -v nvcc 2>/dev/null || echo /x/x)")/../include" \
      /usr/local/cuda/include "$(dirname "$torch_dir")"/nvidia/cu*/include \
      "$(dirname "$torch_dir")"/nvidia/cuda_runtime/include; do
    if [ -f "$cand/cuda.h" ] && [ -f "$cand/cuda_runtime.h" ]; then
      cuda_inc="$(cd "$cand" && pwd)"
      break
    fi
  done
fi
[ -n "$cuda_inc" ] && [ -f "$cuda_inc/cuda.h" ] ||
  die "CUDA headers (cuda.h, cuda_runtime.h) not found: set CUDA_HOME or CUDA_INCLUDE_DIR"
say "CUDA headers: $cuda_inc"
cupti_inc=""
for cand in "$cuda_inc/../extras/CUPTI/include" "$cuda_inc"; do
  if [ -f "$cand/cupti.h" ]; then cupti_inc="$(cd "$cand" && pwd)"; break; fi
done

# ---- generated headers ------------------------------------------------------------------------
fb_inc="$fuser/third_party/flatbuffers/include"
[ -f "$fb_inc/flatbuffers/flatbuffers.h" ] ||
  die "$fb_inc/flatbuffers/flatbuffers.h missing: nvFuser's flatbuffers submodule (third_party/flatbuffers) is required"
generated="$fuser/csrc/serde/fusion_cache_generated.h"
if [ ! -f "$generated" ]; then
  flatc="${FLATC:-$(command -v flatc || true)}"
  [ -n "$flatc" ] || die "generated header csrc/serde/fusion_cache_generated.h is missing and no flatc \
is available to generate it (nvFuser's build runs: flatc --scoped-enums -o csrc/serde/ -c -b csrc/serde/fusion_cache.fbs)"
  say "generating csrc/serde/fusion_cache_generated.h with $flatc ($("$flatc" --version))"
  "$flatc" --scoped-enums -o "$fuser/csrc/serde/" -c -b "$fuser/csrc/serde/fusion_cache.fbs"
fi
say "generated header present: csrc/serde/fusion_cache_generated.h"

# ---- overlay: our ipc_handle.h shadows nvFuser's ------------------------------------------------
overlay="$out/overlay"
rm -rf "$overlay"
mkdir -p "$overlay/multidevice"
cp "$root/integrations/nvfuser/ipc_handle.h" "$overlay/multidevice/ipc_handle.h"

defs=(-DTORCH_CUDA_BUILD_MAIN_LIB "-D_GLIBCXX_USE_CXX11_ABI=$cxx11_abi")
if [ -f "$torch_dir/include/torch/csrc/distributed/c10d/TCPStore.hpp" ]; then
  defs+=(-DNVFUSER_DISTRIBUTED)
  say "torch has c10d: NVFUSER_DISTRIBUTED on (the adapter over c10d::TCPStore is compiled)"
fi
# integrations/nvfuser/common: the drop-ins' shared nvfuser_ipc_dropin.h, on the include path as
# nvfuser_ipc.cmake puts it on codegen_internal's.
incs=(-I"$overlay" -I"$fuser/csrc" -I"$fuser/lib/dynamic_type/src" -I"$fuser/python"
      -I"$root/include" -I"$root/integrations/nvfuser/common"
      -isystem "$fb_inc" -isystem "$torch_dir/include"
      -isystem "$torch_dir/include/torch/csrc/api/include" -isystem "$cuda_inc")
if [ -n "$cupti_inc" ]; then incs+=(-isystem "$cupti_inc"); fi
# Further system include dirs (e.g. CUDA math-library headers kept elsewhere), ':'-separated.
IFS=':' read -r -a extra_incs <<<"${EXTRA_INCLUDE_DIRS:-}"
for d in "${extra_incs[@]}"; do [ -n "$d" ] && incs+=(-isystem "$d"); done
# torch's CUDA wheels have no crt/, CCCL or cuda_profiler_api.h, which nvFuser's sources include:
# take them from NVIDIA's header wheels of the same version (cached; see scripts/nvfuser/cuda-headers.sh).
if [ ! -f "$cuda_inc/crt/host_config.h" ]; then
  more_inc="$(bash "$root/scripts/nvfuser/cuda-headers.sh" "$python")" ||
    die "CUDA headers at $cuda_inc lack crt/host_config.h and scripts/nvfuser/cuda-headers.sh could not fetch them"
  say "CUDA header wheels (crt, CCCL, profiler API): $more_inc"
  incs+=(-isystem "$more_inc")
fi
common=(-std=c++20 -fPIC -fvisibility=hidden -fvisibility-inlines-hidden -O0 "${defs[@]}" "${incs[@]}")

try_compile() { # name source extra-flags...
  local name="$1" src="$2"
  shift 2
  say "compiling $src"
  local start=$SECONDS
  rm -f "$out/$name.o"
  if ! "$cxx" "${common[@]}" "$@" -c "$src" -o "$out/$name.o" >"$out/$name.log" 2>&1; then
    head -n 30 "$out/$name.log" >&2
    return 1
  fi
  say "  ok in $((SECONDS - start)) s: $out/$name.o"
}
compile() { try_compile "$@" || die "compiling $2 (full log: $out/$1.log)"; }

# Ours: exactly -Wall -Werror. nvFuser's own files: with nvFuser's own warning flags.
compile ipc_handle "$root/integrations/nvfuser/ipc_handle.cpp" -Wall -Werror
if [[ " ${defs[*]} " == *" -DNVFUSER_DISTRIBUTED "* ]]; then
  # nvFuser built without torch.distributed (c10d_mock.h): the own-store branch.
  compile ipc_handle_nodist "$root/integrations/nvfuser/ipc_handle.cpp" -Wall -Werror -UNVFUSER_DISTRIBUTED
fi
fuser_flags=(-Wall -Wno-unused-function -Werror -Wno-error=restrict -Wno-error=stringop-overflow
             -Wno-error=maybe-uninitialized)
# CUDA 13's cudaTypedefs.h lacks the unversioned PFN_cu* aliases that nvFuser's driver_api.h at
# this commit uses: force-include the shim that defines them (and accept the deprecation of
# cudaGetDriverEntryPoint, as nvFuser's build on CUDA 13 must).
if ! grep -qE '(define|typedef).*PFN_cuGetErrorString[^_]' "$cuda_inc/cudaTypedefs.h"; then
  shim="$root/integrations/nvfuser/seed-compat/cuda13_pfn.h"
  say "CUDA headers without unversioned PFN_cu* typedefs: force-including $shim"
  fuser_flags+=(-include "$shim" -Wno-error=deprecated-declarations)
fi
gtest_incs=(-isystem "$fuser/third_party/googletest/googletest/include"
            -isystem "$fuser/third_party/googletest/googlemock/include" -I"$fuser" -DUSE_GTEST)
# Every caller of the header must compile against the drop-in: nvFuser's sources, the three
# multidevice test files that use it, and the host-IR driver of this repository.
callers=()
for caller in cuda_p2p:csrc/multidevice/cuda_p2p.cpp executor:csrc/host_ir/executor.cpp \
    test_host_ir:tests/cpp/test_multidevice_host_ir.cpp \
    test_communications:tests/cpp/test_multidevice_communications.cpp \
    test_ipc:tests/cpp/test_multidevice_ipc.cpp; do
  name="${caller%%:*}"
  src="$fuser/${caller#*:}"
  [ -f "$src" ] || die "$src missing: the checkout needs csrc/ and tests/cpp/ of nvFuser"
  compile "$name" "$src" "${fuser_flags[@]}" "${gtest_incs[@]}"
  callers+=("$name")
done
compile hostir_driver "$root/integrations/nvfuser/hostir_driver/hostir_driver.cpp" \
  "${fuser_flags[@]}" "${gtest_incs[@]}"
callers+=(hostir_driver)

# ---- symbols: what the callers need from ipc_handle.o, it defines --------------------------------
defined="$(nm -C --defined-only "$out/ipc_handle.o" | grep -E ' [TW] ' | sed 's/^[0-9a-f]* [TW] //' | sort -u)"
missing=0
for obj in "${callers[@]}"; do
  while IFS= read -r sym; do
    [ -z "$sym" ] && continue
    if ! grep -qxF "$sym" <<<"$defined"; then
      echo "  $obj.o needs '$sym', which ipc_handle.o does not define" >&2
      missing=$((missing + 1))
    else
      say "  $obj.o -> $sym: defined"
    fi
  done < <(nm -C --undefined-only "$out/$obj.o" | sed 's/^ *U //' |
    grep -E '^((typeinfo|typeinfo name|vtable) for )?nvfuser::(IpcHandle|P2pIpcHandle|IpcHandleCache)(::|$)' | sort -u)
done
[ "$missing" -eq 0 ] || die "$missing IpcHandle symbol(s) used by nvFuser are not defined by the drop-in"
for sym in 'nvfuser::IpcHandleCache::exchangeHandles' 'nvfuser::IpcHandleCache::IpcHandleCache' \
    'nvfuser::IpcHandleCache::~IpcHandleCache' 'nvfuser::IpcHandleCache::get'; do
  grep -q "^$sym" <<<"$defined" || die "ipc_handle.o does not define $sym"
done
say "nvfipc symbols ipc_handle.o imports from libnvfuser_ipc: $(nm --undefined-only "$out/ipc_handle.o" | grep -c ' nvfipc_')"
say "PASSED: the drop-in compiles against $fuser with nvFuser's flags, and every caller (${callers[*]}) compiles against its header and links to it"
