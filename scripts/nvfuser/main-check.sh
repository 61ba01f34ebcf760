#!/usr/bin/env bash
# Compiles the drop-in for nvFuser main (integrations/nvfuser/main/ipc_handle.{h,cpp}) and main's
# callers of the header against it, the way nvFuser's CMake compiles them at NVIDIA/Fuser
# 81c4b22fd750d377d69e24928c32233162f6b2bd: C++20, PIC, hidden visibility, -DTORCH_CUDA_BUILD_MAIN_LIB,
# NVFUSER_DISTRIBUTED when torch has c10d, include dirs csrc/, lib/dynamic_type/src, python/,
# python/python_common, torch's and CUDA's; -Wall -Werror everywhere, plus the other warning flags
# each target of main's CMake adds.
#
# Our ipc_handle.h shadows csrc/multidevice/ipc_handle.h through an overlay include dir placed
# first; each compile writes its header dependencies, and the check fails if any file read
# nvFuser's own ipc_handle.h. Compiled, one at a time:
#   ours     integrations/nvfuser/main/ipc_handle.cpp, with and without NVFUSER_DISTRIBUTED
#   csrc     host_ir/evaluator.cpp, multidevice/cuda_p2p.cpp, host_ir/pass/stream_parallel_type.cpp,
#            multidevice/dispatch_combine.cpp, host_ir/jit.cpp (needs LLVM >= 18 headers)
#   bench    benchmarks/cpp/p2p_communication.cpp
#   tests    tests/cpp/test_host_irs.cpp, test_host_ir_{evaluator,integration,stream_lowering}.cpp,
#            test_multidevice_{alltoallv,communications,dispatch_combine,host_ir,host_ir_overlap,ipc,
#            lower_communication,lower_communication_cuda,stream_parallel_type,symmetric_tensor,tma,
#            tutorial}.cpp
#   driver   integrations/nvfuser/main/driver/main_driver.cpp (nvfipc_main_driver, test flags)
#            against the drop-in's header, and again against nvFuser's own header (no overlay;
#            that compile must read csrc/multidevice/ipc_handle.h): the suite builds it in both
# Then every IpcHandle* / P2pIpcHandle / IpcHandleCache / SymMem* / SymmetricMemory* symbol the
# callers' objects need is checked to be defined by our object. Any file missing, not compiled
# or skipped fails the check (non-zero, FAILED); it says PASSED only when every file compiled.
#
# Usage: scripts/nvfuser/main-check.sh [NVFUSER_CHECKOUT [OUT_DIR]]
#   NVFUSER_CHECKOUT  an NVIDIA/Fuser source tree at 81c4b22fd (default: $NVFUSER_MAIN); csrc/,
#                     lib/dynamic_type/, python/, tests/cpp/, benchmarks/cpp/ and the googletest
#                     submodule (third_party/googletest) are read. Nothing is written to it.
#   OUT_DIR           objects, dependency files and logs (default: $OUT or a temporary directory)
#
# Generated headers: nvfuser_resources/<name>.h (multidevice/cuda_p2p.cpp and the TMA test include
# alltoallv.h, multicast.h, multicast_reduce.h and tma_copy.h). main's CMake makes one per
# runtime/<name>.cu with nvFuser's tools/stringify_file.py into <build>/include; the script runs the
# same tool the same way into OUT_DIR/generated. Nothing else generated is read by these files.
#
# Environment: PYTHON (python with torch; default: scripts/lib/python-env.sh's venv), CUDA_HOME or
# CUDA_INCLUDE_DIR (CUDA 13 headers; default: nvcc's, /usr/local/cuda, or the nvidia/cu13/include
# of torch's pip wheels, completed by scripts/nvfuser/cuda-headers.sh), LLVM_INCLUDE_DIR (LLVM >= 18
# headers for host_ir/jit.cpp; default: `llvm-config --includedir` when it is >= 18), CXX
# (default g++), EXTRA_INCLUDE_DIRS (':'-separated system include dirs).
set -euo pipefail

FUSER_COMMIT=81c4b22fd750d377d69e24928c32233162f6b2bd

die() {
  echo "nvfuser-main-check: FAILED: $*" >&2
  exit 1
}
say() { echo "nvfuser-main-check: $*"; }

root="$(cd "$(dirname "$0")/../.." && pwd)"
src_arg="${1:-${NVFUSER_MAIN:-}}"
[ -n "$src_arg" ] || die "usage: $0 NVFUSER_CHECKOUT [OUT_DIR] (or set NVFUSER_MAIN)"
fuser="$(cd "$src_arg" && pwd)" || die "no such directory: $src_arg"
out="${2:-${OUT:-$(mktemp -d)}}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cxx="${CXX:-g++}"
python="${PYTHON:-$(bash "$root/scripts/lib/python-env.sh")}"
dropin="$root/integrations/nvfuser/main"

[ -f "$fuser/csrc/multidevice/ipc_handle.h" ] ||
  die "$fuser does not look like an nvFuser checkout (csrc/multidevice/ipc_handle.h missing)"
[ -f "$fuser/csrc/host_ir/evaluator.h" ] ||
  die "$fuser/csrc/host_ir/evaluator.h missing: this check is for nvFuser main ($FUSER_COMMIT)"
[ -f "$fuser/csrc/multidevice/symmetric_tensor.h" ] ||
  die "$fuser/csrc/multidevice/symmetric_tensor.h missing: this check is for nvFuser main ($FUSER_COMMIT)"
[ -f "$fuser/third_party/googletest/googletest/include/gtest/gtest.h" ] ||
  die "$fuser/third_party/googletest missing (nvFuser's googletest submodule; the tests need its headers)"
if git -C "$fuser" rev-parse HEAD >/dev/null 2>&1; then
  head_commit="$(git -C "$fuser" rev-parse HEAD)"
  [ "$head_commit" = "$FUSER_COMMIT" ] ||
    say "WARNING: $fuser is at $head_commit, the drop-in targets $FUSER_COMMIT"
fi

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
      /usr/local/cuda/include "$(dirname "$torch_dir")"/nvidia/cu*/include; do
    if [ -f "$cand/cuda.h" ] && [ -f "$cand/cuda_runtime.h" ]; then
      cuda_inc="$(cd "$cand" && pwd)"
      break
    fi
  done
fi
[ -n "$cuda_inc" ] && [ -f "$cuda_inc/cuda.h" ] ||
  die "CUDA headers (cuda.h, cuda_runtime.h) not found: set CUDA_HOME or CUDA_INCLUDE_DIR"
cuda_version="$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$cuda_inc/cuda.h")"
say "CUDA headers: $cuda_inc (CUDA_VERSION $cuda_version)"
[ "${cuda_version:-0}" -ge 13000 ] ||
  say "WARNING: CUDA < 13: SymmetricTensor's multicast is compiled out (nvFuser main targets CUDA 13)"

# ---- LLVM headers (host_ir/jit.cpp) -----------------------------------------------------------
llvm_inc="${LLVM_INCLUDE_DIR:-}"
if [ -z "$llvm_inc" ] && command -v llvm-config >/dev/null 2>&1; then
  if [ "$(llvm-config --version | cut -d. -f1)" -ge 18 ]; then llvm_inc="$(llvm-config --includedir)"; fi
fi
[ -n "$llvm_inc" ] && [ -f "$llvm_inc/llvm/ExecutionEngine/Orc/LLJIT.h" ] ||
  die "LLVM >= 18 headers not found (host_ir/jit.cpp includes evaluator.h and needs them): set \
LLVM_INCLUDE_DIR, e.g. to usr/lib/llvm-19/include of \`apt-get download llvm-19-dev && dpkg-deb -x llvm-19-dev_*.deb DIR\`"
say "LLVM headers: $llvm_inc"

# ---- overlay: our ipc_handle.h shadows nvFuser's ------------------------------------------------
overlay="$out/overlay"
rm -rf "$overlay"
mkdir -p "$overlay/multidevice"
cp "$dropin/ipc_handle.h" "$overlay/multidevice/ipc_handle.h"

# ---- generated headers: nvfuser_resources/<name>.h, as main's CMake makes them ------------------
gen="$out/generated"
rm -rf "$gen"
mkdir -p "$gen/nvfuser_resources"
[ -f "$fuser/tools/stringify_file.py" ] || die "$fuser/tools/stringify_file.py missing (it generates nvfuser_resources/*.h)"
for cu in "$fuser"/runtime/*.cu; do
  "$python" "$fuser/tools/stringify_file.py" -i "$cu" -o "$gen/nvfuser_resources/$(basename "$cu" .cu).h" ||
    die "generating nvfuser_resources/$(basename "$cu" .cu).h from $cu"
done
say "generated $(ls "$gen/nvfuser_resources" | wc -l) nvfuser_resources headers with tools/stringify_file.py"

defs=(-DTORCH_CUDA_BUILD_MAIN_LIB "-D_GLIBCXX_USE_CXX11_ABI=$cxx11_abi")
if [ -f "$torch_dir/include/torch/csrc/distributed/c10d/TCPStore.hpp" ]; then
  defs+=(-DNVFUSER_DISTRIBUTED)
  say "torch has c10d: NVFUSER_DISTRIBUTED on"
else
  die "torch at $torch_dir has no c10d headers: main's distributed callers (and the benchmark) need USE_DISTRIBUTED"
fi
# integrations/nvfuser/common: the drop-ins' shared nvfuser_ipc_dropin.h, on the include path as
# nvfuser_ipc.cmake puts it on codegen_internal's.
incs=(-I"$overlay" -I"$fuser/csrc" -I"$fuser/lib/dynamic_type/src" -I"$fuser/python"
      -I"$fuser/python/python_common" -I"$gen" -I"$root/include" -I"$root/integrations/nvfuser/common"
      -isystem "$torch_dir/include" -isystem "$torch_dir/include/torch/csrc/api/include"
      -isystem "$cuda_inc")
for cand in "$cuda_inc/../extras/CUPTI/include" "$cuda_inc"; do
  if [ -f "$cand/cupti.h" ]; then incs+=(-isystem "$(cd "$cand" && pwd)"); break; fi
done
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

# Flags of main's CMake targets (besides -Wall -Werror, which every file gets).
ours_flags=(-Wall -Werror)
codegen_flags=(-Wall -Wno-unused-function -Werror -Wno-error=restrict -Wno-error=stringop-overflow
               -Wno-error=maybe-uninitialized)
llvm_flags=(-isystem "$llvm_inc" -D_GNU_SOURCE -D__STDC_CONSTANT_MACROS -D__STDC_FORMAT_MACROS
            -D__STDC_LIMIT_MACROS)
bench_flags=(-Wall -Wno-unused-function -Werror -Wno-deprecated-copy -I"$fuser")
test_flags=(-Wall -Wno-unused-function -Werror -DUSE_GTEST -I"$fuser"
            -isystem "$fuser/third_party/googletest/googletest/include"
            -isystem "$fuser/third_party/googletest/googlemock/include")

compiled=()
failed=()
compile() { # name source flags...
  local name="$1" src="$2"
  shift 2
  # MAIN_CHECK_ONLY="ipc_handle name ...": compile only these (a quick check, reported SKIPPED,
  # never PASSED; ipc_handle must be among them; the symbol check then covers
  # only them).
  if [ -n "${MAIN_CHECK_ONLY:-}" ] && [[ " $MAIN_CHECK_ONLY " != *" $name "* ]]; then
    return 0
  fi
  [ -f "$src" ] || die "$src missing: the checkout needs csrc/, tests/cpp/ and benchmarks/cpp/ of nvFuser"
  say "compiling ${src#"$fuser"/}"
  local start=$SECONDS
  rm -f "$out/$name.o" "$out/$name.d"
  if ! "$cxx" "${common[@]}" "$@" -MD -MF "$out/$name.d" -c "$src" -o "$out/$name.o" \
      >"$out/$name.log" 2>&1; then
    head -n 40 "$out/$name.log" >&2
    say "  FAILED: $name (full log: $out/$name.log)"
    failed+=("$name")
    return 0
  fi
  # The overlay must have won: nvFuser's own ipc_handle.h may not be read.
  if grep -q "$fuser/csrc/multidevice/ipc_handle.h" "$out/$name.d"; then
    say "  FAILED: $name read nvFuser's csrc/multidevice/ipc_handle.h instead of the drop-in's"
    failed+=("$name")
    return 0
  fi
  local uses="does not include ipc_handle.h"
  if grep -q "$overlay/multidevice/ipc_handle.h" "$out/$name.d"; then uses="includes the drop-in's ipc_handle.h"; fi
  say "  ok in $((SECONDS - start)) s ($uses)"
  compiled+=("$name")
}

# One at a time (-j1): each of these takes 30-90 s and a few GB of memory.
compile ipc_handle "$dropin/ipc_handle.cpp" "${ours_flags[@]}"
compile ipc_handle_nodist "$dropin/ipc_handle.cpp" "${ours_flags[@]}" -UNVFUSER_DISTRIBUTED

callers=()
for entry in \
    evaluator:csrc/host_ir/evaluator.cpp \
    cuda_p2p:csrc/multidevice/cuda_p2p.cpp \
    stream_parallel_type:csrc/host_ir/pass/stream_parallel_type.cpp \
    dispatch_combine:csrc/multidevice/dispatch_combine.cpp; do
  compile "${entry%%:*}" "$fuser/${entry#*:}" "${codegen_flags[@]}"
  callers+=("${entry%%:*}")
done
compile jit "$fuser/csrc/host_ir/jit.cpp" "${codegen_flags[@]}" "${llvm_flags[@]}"
callers+=(jit)
# SymmetricTensor with the overlay (integrations/nvfuser/main/symmetric_overlay.py) applied to a
# copy of its source: it calls the drop-in's nvfipc_symmetric functions.
mkdir -p "$out/overlaid/csrc/multidevice"
cp "$fuser/csrc/multidevice/symmetric_tensor.cpp" "$out/overlaid/csrc/multidevice/"
python3 "$dropin/symmetric_overlay.py" "$out/overlaid" >/dev/null ||
  die "symmetric_overlay.py does not apply to $fuser/csrc/multidevice/symmetric_tensor.cpp"
compile symmetric_tensor_overlaid "$out/overlaid/csrc/multidevice/symmetric_tensor.cpp" \
  "${codegen_flags[@]}" -I"$fuser/csrc"
callers+=(symmetric_tensor_overlaid)
compile p2p_communication_bench "$fuser/benchmarks/cpp/p2p_communication.cpp" "${bench_flags[@]}"
callers+=(p2p_communication_bench)
for test in test_host_irs test_host_ir_evaluator test_host_ir_integration test_host_ir_stream_lowering \
    test_multidevice_alltoallv test_multidevice_communications test_multidevice_dispatch_combine \
    test_multidevice_host_ir test_multidevice_host_ir_overlap test_multidevice_ipc \
    test_multidevice_lower_communication test_multidevice_lower_communication_cuda \
    test_multidevice_stream_parallel_type test_multidevice_symmetric_tensor test_multidevice_tma \
    test_multidevice_tutorial; do
  compile "$test" "$fuser/tests/cpp/$test.cpp" "${test_flags[@]}"
  callers+=("$test")
done

# nvfipc_main_driver, built by scripts/nvfuser/main-suite.sh with the stock files and with the
# drop-in: against both headers.
driver_src="$dropin/driver/main_driver.cpp"
compile main_driver "$driver_src" "${test_flags[@]}"
callers+=(main_driver)
stock_common=()
for flag in "${common[@]}"; do [ "$flag" = "-I$overlay" ] || stock_common+=("$flag"); done
if [ -z "${MAIN_CHECK_ONLY:-}" ] || [[ " $MAIN_CHECK_ONLY " == *" main_driver_stock "* ]]; then
  say "compiling ${driver_src#"$root"/} against nvFuser's own ipc_handle.h"
  start=$SECONDS
  if ! "$cxx" "${stock_common[@]}" "${test_flags[@]}" -MD -MF "$out/main_driver_stock.d" -c "$driver_src" \
      -o "$out/main_driver_stock.o" >"$out/main_driver_stock.log" 2>&1; then
    head -n 40 "$out/main_driver_stock.log" >&2
    say "  FAILED: main_driver_stock (full log: $out/main_driver_stock.log)"
    failed+=(main_driver_stock)
  elif ! grep -q "$fuser/csrc/multidevice/ipc_handle.h" "$out/main_driver_stock.d"; then
    say "  FAILED: main_driver_stock did not read nvFuser's csrc/multidevice/ipc_handle.h"
    failed+=(main_driver_stock)
  else
    say "  ok in $((SECONDS - start)) s (includes nvFuser's own ipc_handle.h)"
    compiled+=(main_driver_stock)
  fi
fi

[ "${#failed[@]}" -eq 0 ] || die "${#failed[@]} file(s) did not compile: ${failed[*]} (compiled: ${compiled[*]})"

# ---- symbols: what the callers need from ipc_handle.o, it defines --------------------------------
defined="$(nm -C --defined-only "$out/ipc_handle.o" | grep -E ' [TWVu] ' | sed 's/^[0-9a-f]* [TWVu] //' | sort -u)"
ours_re='nvfuser::(IpcHandle|P2pIpcHandle|IpcHandleCache|SymmetricMemoryHandle|SymmetricMemoryHandleCache|SymMemFor[A-Za-z]*|SymmetricMemoryFor[A-Za-z]*|nvfipc_symmetric)(::|$)'
missing=0
used=0
for obj in "${callers[@]}"; do
  [ -n "${MAIN_CHECK_ONLY:-}" ] && [ ! -f "$out/$obj.o" ] && continue
  while IFS= read -r sym; do
    [ -z "$sym" ] && continue
    used=$((used + 1))
    if ! grep -qxF "$sym" <<<"$defined"; then
      echo "  $obj.o needs '$sym', which ipc_handle.o does not define" >&2
      missing=$((missing + 1))
    else
      say "  $obj.o -> $sym: defined"
    fi
  done < <(nm -C --undefined-only "$out/$obj.o" | sed 's/^ *U //' |
    grep -E "^((typeinfo|typeinfo name|vtable) for )?$ours_re" | sort -u)
done
[ "$missing" -eq 0 ] || die "$missing symbol(s) used by nvFuser are not defined by the drop-in"
if [ -n "${MAIN_CHECK_ONLY:-}" ]; then
  say "SKIPPED: only what MAIN_CHECK_ONLY names was checked (${compiled[*]} compiled, $used symbol uses defined); every other file was not compiled"
  exit 0
fi
[ "$used" -gt 0 ] || die "no caller needs a symbol of the drop-in: the overlay did not take effect"
say "nvfipc symbols ipc_handle.o imports from libnvfuser_ipc: $(nm --undefined-only "$out/ipc_handle.o" | grep -c ' nvfipc_')"
say "PASSED: the drop-in compiles against nvFuser $FUSER_COMMIT at $fuser with -Wall -Werror, and every caller (${callers[*]}) compiles against its header and links to it ($used symbol uses)"
