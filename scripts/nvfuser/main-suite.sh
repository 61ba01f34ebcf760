#!/usr/bin/env bash
# nvFuser main's own tests (NVIDIA/Fuser 81c4b22fd750d377d69e24928c32233162f6b2bd), stock beside
# the drop-in of integrations/nvfuser/main/, on one GPU machine without network or cargo. Run from
# the repository root; resumable: every call continues where the last stopped and returns before
# its time budget, so a build longer than one command's limit is finished by calling it again
# (the work directory survives between calls on the same warm machine).
#
#   bash scripts/nvfuser/main-suite.sh        # repeat until it prints "nvfuser-main-suite: DONE"
#
# Inputs, prepared where cargo and the network are (scripts/nvfuser/main-prepare.sh), in .nvf-main/:
#   nvfuser-main.tar.xz  nvFuser main with its submodules flatbuffers, googletest, benchmark
#   llvm19.tar.xz        LLVM 19 headers, libLLVM.so.19.1, libz3.so.4, a CMake config for them
#   ipc-src.tar.xz       the nvfuser-ipc tree (committed HEAD) whose drop-in is tested
#   lib/libnvfuser_ipc.so  that tree's library
# Settings:
#   WORK      work directory (default build/nvfuser-main-suite)
#   BUDGET    seconds this call may use (default 570)
#   JOBS      ninja -j (default 16)
#   PCH       1 (default): nvFuser's precompiled headers (NVFUSER_USE_PCH: its ten headers of
#             longest parse time compiled once, reused by every source and the tests; the same in
#             both builds); 0 without. A configure that fails with them, or a build whose errors
#             name the precompiled header, is done again without them, once.
#   SHARDS    parallel single-rank shards per build (default 6)
#   TEST_TIMEOUT   seconds for the single-rank runs, all shards of both builds at once (default 300)
#   SR_FILTER      gtest patterns of the single-rank run (default: every test)
#   SR_EXCLUDE     gtest patterns left out of the single-rank run (default: below)
#   MR_TEST_TIMEOUT  seconds for one test at one world size, both builds at once (default 90)
#   MR_WORLDS      world sizes of the multi-rank tests (default "2 4")
#   MR_PROCS       test processes at once in the multi-rank run (default 24)
#   MR_FILTER, MR_EXCLUDE  gtest patterns of the multi-rank tests (defaults: below);
#   MR_WIDE_FILTER the tests run above two ranks (default: below)
#   BUILDS         the builds made and run (default "stock ours"); "ours" builds and runs the
#                  drop-in alone, for a run whose stock results are on record
#   MR_ALONE       "W:test" words: tests run again afterwards one at a time, W ranks each
#                  (outcomes that concurrent tests may change), reported in a table of their own
#
# Steps (a marker file under $WORK/state records each one done):
#   unpack      sources, LLVM, nvfuser-ipc; nvFuser's own ipc_handle.{h,cpp} kept in $WORK/stock;
#               one include() of nvfuser_ipc.cmake appended to nvFuser's CMakeLists.txt (links the
#               library; the stock sources do not use it), then one of main_driver.cmake
#               (nvfipc_main_driver, integrations/nvfuser/main/driver/)
#   patch       the same changes in both builds, none in the two files under test:
#               - host_ir/evaluator.cpp: HostIrEvaluator's default stream on the local device
#                 (my_local_device_index_) instead of cuda:<global rank>, which does not exist
#                 when two ranks share one GPU (rank 1: "Device index value 1 is out of range")
#               - multidevice/symmetric_tensor.cpp: SymmetricTensor::remoteTensor(rank) labels
#                 the peer's mapping cuda:<rank> (one GPU per rank); here every rank is on the one
#                 GPU, so it gets the local tensor's device (else "Specified device cuda:1 does
#                 not match device of data cuda:0" in every user of remote tensors, both builds)
#               - tests: MultiDeviceTest.ShareIpcMemHandles and P2PCommunicationTest.CudaComm skip
#                 unless there are 2 GPUs; the GPU-count half of that check is dropped so that 2
#                 ranks on one GPU run them (CUDA IPC between processes on one device works)
#   configure   Ninja, no optimisation (CMAKE_BUILD_TYPE empty), BUILD_TEST=ON, BUILD_PYTHON=OFF,
#               NVFUSER_DISABLE_CUTLASS=ON, NVFUSER_USE_PCH per PCH, LLVM_DIR = the carried LLVM 19
#   build-stock, stash-stock  nvFuser's own files; test_multidevice and nvfipc_main_driver copied
#               to $WORK/bin-stock
#   swap        integrations/nvfuser/main/ipc_handle.{h,cpp} over them, and
#               integrations/nvfuser/main/symmetric_overlay.py applied to
#               multidevice/symmetric_tensor.cpp (SymmetricTensor's remote handles and contiguous
#               view through nvfuser-ipc's symmetric rendezvous; ninja rebuilds the includers and
#               relinks)
#   build-ours, stash-ours
#   mr          W ranks on the one GPU (W in MR_WORLDS), each its own node (LOCAL_RANK=0,
#               LOCAL_WORLD_SIZE=1, rank 0 hosting the TCPStore), the tests that check the number
#               of ranks, not GPUs; NCCL sees the ranks as W hosts (NCCL_HOSTID differs, sockets
#               over lo), as it refuses two ranks of one host on one GPU ("Duplicate GPU
#               detected"); every test in processes of its own (MR_TEST_TIMEOUT each), so a test
#               that stalls one rank costs only itself; several tests at once (MR_PROCS)
#   tests       all of test_multidevice with one rank, gtest shards, stock and ours side by side
#   report      $OUT/nvfuser-main-suite.md (with the processes that printed store or library
#               warnings: scripts/nvfuser/exit_noise.py) and the raw logs
# Not a step: run_driver LABEL WORLD runs nvfipc_main_driver of one build with WORLD ranks
# (see the function).
# Tests that would create a multicast object (cuMulticastCreate) are filtered out everywhere:
# this workplace keeps NVLink multicast off.
set -uo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
start_s=$(date +%s)
BUDGET="${BUDGET:-570}"
IN="${IN:-.nvf-main}"
WORK="${WORK:-build/nvfuser-main-suite}"
JOBS="${JOBS:-16}"
PCH="${PCH:-1}"
SHARDS="${SHARDS:-6}"
TEST_TIMEOUT="${TEST_TIMEOUT:-300}"
MR_TEST_TIMEOUT="${MR_TEST_TIMEOUT:-90}"
MR_WORLDS="${MR_WORLDS:-2 4}"
MR_PROCS="${MR_PROCS:-24}"
# The one-rank run leaves out what never reaches IPC or symmetric memory and takes minutes.
SR_EXCLUDE="${SR_EXCLUDE:-DistributedTransformerTest.*}"
SR_FILTER="${SR_FILTER:-*}"
SINGLE_RANK="${SINGLE_RANK:-1}"
DRIVER_WORLDS="${DRIVER_WORLDS-2 4}"
OUT="${OUT:-$WORK/out}"
mkdir -p "$WORK/state" "$WORK/results" "$OUT"
WORK="$(cd "$WORK" && pwd)"
OUT="$(cd "$OUT" && pwd)"
IN="$(cd "$IN" && pwd)"
src="$WORK/src"
bld="$WORK/build"
res="$WORK/results"
llvm="$WORK/llvm19"
ipc="$WORK/ipc"
log="$OUT/nvfuser-main-suite.log"
# No multicast objects on this workplace's machines (see the header).
NO_MCAST='*Multicast*:*multicast*:*Nvls*:*/memcpy_*:*/multimem_*:RSMatmulTest.ReduceScatterReduceBased*'
MR_FILTER="${MR_FILTER:-MultiDeviceTest.ShareIpcMemHandles:P2PCommunicationTest.*:P2PCommHostIrTest.*:SymmetricTensorTest.*:AlltoallvCudaTest.*:MultiDeviceHostIrTest.SymmetricContiguousView:StreamParallelBackendTest.*:MultiDeviceStreamParallelTypeTest.AllgatherInterStreamSyncNoWrap:RingAllgatherOverlapTest.*:RSMatmulTest.ReduceScatterP2p*:DispatchCombine*:TmaTest.*:LowerCollectiveCudaAndNcclTest.*batch_memcpy*}"
# These tests themselves allocate on cuda:<rank>, which does not exist when two ranks share one
# GPU, in both builds alike: they need one GPU per rank.
MR_EXCLUDE="${MR_EXCLUDE:-SymmetricTensorTest.PreallocatedTensor:SymmetricTensorTest.ContiguousView}"
# Above two ranks, the tests of MR_WIDE_FILTER only (those that may use more than two ranks and
# reach IPC or symmetric memory; the batched-memcpy collectives at one size): the device time of
# one run is bounded.
MR_WIDE_FILTER="${MR_WIDE_FILTER:-MultiDeviceTest.ShareIpcMemHandles:P2PCommHostIrTest.*:SymmetricTensorTest.*:AlltoallvCudaTest.*:MultiDeviceHostIrTest.SymmetricContiguousView:StreamParallelBackendTest.*:RingAllgatherOverlapTest.*CudaIpc*:DispatchCombine*:LowerCollectiveCudaAndNcclTest.*batch_memcpy_128KB}"

STEPS_NAME=nvfuser-main-suite
# shellcheck source=../lib/resumable-steps.sh
. "$repo/scripts/lib/resumable-steps.sh"
# A run resumed after its build fell back to no precompiled headers stays without them.
done_ pch-off && PCH=0

python="$(command -v python3)"
torch_dir="$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null)" ||
  die "python3 cannot import torch"

# ---- unpack ---------------------------------------------------------------------------------
for f in nvfuser-main.tar.xz llvm19.tar.xz ipc-src.tar.xz lib/libnvfuser_ipc.so; do
  [ -f "$IN/$f" ] || die "$IN/$f missing: run scripts/nvfuser/main-prepare.sh where the network is"
done
sum="$(cat "$IN"/*.tar.xz "$IN/lib/libnvfuser_ipc.so" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$WORK/state/sources" 2>/dev/null)" != "$sum" ]; then
  rm -rf "$WORK/state" "$bld" "$WORK"/bin-*
  mkdir -p "$WORK/state"
fi
# shellcheck disable=SC2086 # RERUN is a list of step names
forget_steps ${RERUN:-}
if [ -n "${ONLY_IF_BUILT:-}" ] && ! done_ stash-ours; then
  die "ONLY_IF_BUILT: this machine holds no build"
fi
if ! done_ unpack; then
  rm -rf "$src" "$WORK/stock" "$llvm" "$ipc" "$WORK/lib"
  mkdir -p "$src" "$WORK/stock" "$ipc" "$WORK/lib"
  tar -xJf "$IN/nvfuser-main.tar.xz" -C "$src" || die "unpacking nvfuser-main.tar.xz"
  tar -xJf "$IN/llvm19.tar.xz" -C "$WORK" || die "unpacking llvm19.tar.xz"
  tar -xJf "$IN/ipc-src.tar.xz" -C "$ipc" || die "unpacking ipc-src.tar.xz"
  cp "$IN/lib/libnvfuser_ipc.so" "$WORK/lib/"
  cp "$src/csrc/multidevice/ipc_handle.h" "$src/csrc/multidevice/ipc_handle.cpp" "$WORK/stock/"
  printf '\ninclude("%s/integrations/nvfuser/nvfuser_ipc.cmake")\n' "$ipc" >>"$src/CMakeLists.txt"
  # nvfipc_main_driver (run_driver below), after the tests like nvFuser's own test binaries.
  printf 'include("%s/integrations/nvfuser/main/driver/main_driver.cmake")\n' "$ipc" >>"$src/CMakeLists.txt"
  mark unpack
  echo "$sum" >"$WORK/state/sources"
  say "unpacked $(du -sh "$src" | cut -f1) of sources; nvfuser-ipc $(cat "$IN/ipc-commit" 2>/dev/null)"
fi
export LD_LIBRARY_PATH="$llvm/lib:$WORK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# ---- patch ----------------------------------------------------------------------------------
if ! done_ patch; then
  perl -0pi -e 's/getDefaultCUDAStream\(\s*static_cast<c10::DeviceIndex>\(device_index\)\)/getDefaultCUDAStream(static_cast<c10::DeviceIndex>(my_local_device_index_))/' \
    "$src/csrc/host_ir/evaluator.cpp"
  grep -q 'getDefaultCUDAStream(static_cast<c10::DeviceIndex>(my_local_device_index_))});' \
    "$src/csrc/host_ir/evaluator.cpp" || die "patching host_ir/evaluator.cpp"
  perl -0pi -e 's/(TEST_F\(MultiDeviceTest, ShareIpcMemHandles\) \{.*?)if \(communicator_->size\(\) < 2 \|\| at::cuda::device_count\(\) < 2\)/$1if (communicator_->size() < 2)/s' \
    "$src/tests/cpp/test_multidevice_host_ir.cpp"
  perl -0pi -e 's/(TEST_P\(P2PCommunicationTest, CudaComm\) \{.*?)if \(communicator_->size\(\) < 2 \|\| at::cuda::device_count\(\) < 2\)/$1if (communicator_->size() < 2)/s' \
    "$src/tests/cpp/test_multidevice_communications.cpp"
  [ "$(grep -c 'device_count() < 2' "$src/tests/cpp/test_multidevice_host_ir.cpp")" = 0 ] ||
    die "patching test_multidevice_host_ir.cpp"
  [ "$(grep -c 'device_count() < 2' "$src/tests/cpp/test_multidevice_communications.cpp")" = 3 ] ||
    die "patching test_multidevice_communications.cpp"
  perl -0pi -e 's/\.device\(at::kCUDA, rank\)\);/.device(local_tensor_.device()));/' \
    "$src/csrc/multidevice/symmetric_tensor.cpp"
  grep -q '.device(local_tensor_.device()));' "$src/csrc/multidevice/symmetric_tensor.cpp" ||
    die "patching multidevice/symmetric_tensor.cpp"
  mark patch
  say "patched: evaluator default stream on the local device; remoteTensor on the local tensor's device; ShareIpcMemHandles and CudaComm need 2 ranks, not 2 GPUs"
fi

# ---- configure ------------------------------------------------------------------------------
without_pch() { # WHY: configured again without precompiled headers, for the rest of the run
  say "$1; configured again without them"
  cmake -B "$bld" -DNVFUSER_USE_PCH=OFF >>"$res/configure.txt" 2>&1 ||
    die "configure without precompiled headers"
  PCH=0
  mark pch-off
}

if ! done_ configure; then
  need 120
  ldd "$llvm/lib/libLLVM.so.19.1" | grep 'not found' && die "libLLVM.so.19.1 misses libraries here"
  pybind_dir="$("$python" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null)"
  link_flags="-Wl,-rpath-link,$llvm/lib -Wl,-rpath,$llvm/lib"
  timeout "$(left)" cmake -S "$src" -B "$bld" -G Ninja \
    -DCMAKE_PREFIX_PATH="$torch_dir/share/cmake" \
    -DPython_EXECUTABLE="$python" ${pybind_dir:+-Dpybind11_DIR="$pybind_dir"} \
    -DUSE_DISTRIBUTED=ON -DNVFUSER_DISTRIBUTED=ON -DBUILD_TEST=ON -DBUILD_PYTHON=OFF \
    -DBUILD_NVFUSER_BENCHMARK=OFF -DNVFUSER_DISABLE_CUTLASS=ON \
    -DNVFUSER_USE_PCH="$([ "$PCH" = 1 ] && echo ON || echo OFF)" \
    -DNVFUSER_REQUIREMENT_GitSubmodules_OPTIONAL=TRUE \
    -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
    -DLLVM_DIR="$llvm/lib/cmake/llvm" \
    -DCMAKE_EXE_LINKER_FLAGS="$link_flags" -DCMAKE_SHARED_LINKER_FLAGS="$link_flags" \
    -DCMAKE_CXX_FLAGS="-Wno-psabi" \
    -DNVFUSER_IPC_SOURCE_DIR="$ipc" -DNVFIPC_PREBUILT_LIB_DIR="$WORK/lib" \
    >"$res/configure.txt" 2>&1 || {
    tail -40 "$res/configure.txt"
    [ "$PCH" = 1 ] || die "configure"
    without_pch "configure failed with precompiled headers"
  }
  mark configure
  say "configured (precompiled headers: $([ "$PCH" = 1 ] && echo on || echo off))"
fi

build() { # label
  local label="$1"
  done_ "build-$label" && return 0
  need 60
  local t0=$(date +%s)
  timeout $(($(left) - 15)) ninja -C "$bld" -j"$JOBS" -k 0 test_multidevice nvfipc_main_driver \
    >>"$res/build-$label.txt" 2>&1
  local rc=$?
  say "build-$label: ninja rc=$rc after $(($(date +%s) - t0)) s ($(grep -o '^\[[0-9]*/[0-9]*\]' "$res/build-$label.txt" | tail -1))"
  if [ "$rc" -eq 124 ]; then
    say "RESUME: the build continues in the next call"
    pack
    exit 0
  fi
  # An error that names the precompiled header (CMake's cmake_pch.hxx, GCC's .gch): once only,
  # the same sources configured without precompiled headers, then built again.
  if [ "$rc" -ne 0 ] && [ "$PCH" = 1 ] &&
    grep -qE 'cmake_pch|\.gch|precompiled header' "$res/build-$label.txt"; then
    grep -m3 -B2 -A8 'error' "$res/build-$label.txt" | head -40
    without_pch "build-$label failed with precompiled headers"
    build "$label"
    return
  fi
  if [ "$rc" -ne 0 ]; then
    grep -m5 -B2 -A12 'error' "$res/build-$label.txt" | head -80
    die "build-$label (log: build-$label.txt in nvfuser-main-suite-logs.tgz)"
  fi
  say "build-$label: done, $(grep -cE 'warning:' "$res/build-$label.txt") compiler warning lines"
  mark "build-$label"
}

stash() { # label
  done_ "stash-$1" && return 0
  mkdir -p "$WORK/bin-$1"
  cp "$(find "$bld" -maxdepth 2 -type f -name test_multidevice -print -quit)" "$WORK/bin-$1/" ||
    die "stash $1"
  cp "$(find "$bld" -maxdepth 2 -type f -name nvfipc_main_driver -print -quit)" "$WORK/bin-$1/" ||
    die "stash $1: nvfipc_main_driver"
  mark "stash-$1"
}

rank_env() { echo "RANK=$1 WORLD_SIZE=$2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1"; }
# shellcheck source=../lib/multi-rank-tests.sh
. "$repo/scripts/lib/multi-rank-tests.sh"

# One rank, all of test_multidevice, stock and ours at the same time: $SHARDS processes each.
single_rank() {
  done_ tests && return 0
  need 90
  local t=$TEST_TIMEOUT
  [ "$(left)" -lt $((t + 20)) ] && t=$(($(left) - 20))
  local t0=$(date +%s) pids=() names=() i label port=29600
  for label in ${BUILDS:-stock ours}; do
    for ((i = 0; i < SHARDS; i++)); do
      port=$((port + 1))
      env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
        NVFUSER_MASTER_PORT="$port" NVFIPC_TIMEOUT_MS=60000 \
        NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
        GTEST_TOTAL_SHARDS="$SHARDS" GTEST_SHARD_INDEX="$i" \
        timeout -k 5 "$t" "$WORK/bin-$label/test_multidevice" --gtest_color=no \
        --gtest_filter="$SR_FILTER-$NO_MCAST:$SR_EXCLUDE" >"$res/test-$label-$i.txt" 2>&1 &
      pids+=($!)
      names+=("$label/$i")
    done
  done
  local rcs=""
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rcs="$rcs ${names[$i]}=$?"
  done
  say "one rank, test_multidevice ($t s limit): exit codes:$rcs after $(($(date +%s) - t0)) s"
  mark tests
}

# ---- run_driver LABEL WORLD [ARGS...] (not a step: call it by hand once stash-LABEL is done) ---
# WORLD ranks of bin-LABEL/nvfipc_main_driver (stock|ours) on the one GPU, each its own node with
# rank 0 hosting the TCPStore, as in multi_rank; NCCL sees the ranks as hosts of their own because
# nvFuser's stock exchangeHandles and SymmetricTensor::setupRemoteHandles call the world's NCCL
# barrier. A store port of its own per run; DRIVER_TIMEOUT seconds (default 300). Log:
# $OUT/driver-LABEL-wWORLD.log (rank 0 first, with the RESULT lines); non-zero if a rank failed.
run_driver() {
  local label="$1" world="$2"
  shift 2
  [ -x "$WORK/bin-$label/nvfipc_main_driver" ] || die "run_driver: no $WORK/bin-$label/nvfipc_main_driver"
  local runs=$(($(cat "$res/driver-runs" 2>/dev/null || echo 0) + 1))
  echo "$runs" >"$res/driver-runs"
  local port=$((29800 + runs)) r pids=() rc=0 addr
  local logf="$OUT/driver-$label-w$world.log"
  for ((r = 0; r < world; r++)); do
    addr=127.0.0.1
    [ "$r" -eq 0 ] && addr=localhost
    env RANK="$r" WORLD_SIZE="$world" LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      NVFUSER_MASTER_ADDR="$addr" NVFUSER_MASTER_PORT="$port" NVFIPC_TIMEOUT_MS=30000 \
      NCCL_HOSTID="nvfmain-driver-$label-rank$r" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
      NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
      timeout -k 5 "${DRIVER_TIMEOUT:-300}" "$WORK/bin-$label/nvfipc_main_driver" "$@" \
      >"$res/driver-$label-w$world-rank$r.txt" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}" || rc=1
  done
  for ((r = 0; r < world; r++)); do
    echo "=== rank $r"
    cat "$res/driver-$label-w$world-rank$r.txt"
  done >"$logf"
  grep '^RESULT' "$logf" | while IFS= read -r l; do say "driver $label: $l"; done
  return "$rc"
}

if builds_has stock; then
  build stock
  stash stock
fi
if ! done_ swap; then
  cp "$ipc/integrations/nvfuser/main/ipc_handle.h" "$ipc/integrations/nvfuser/main/ipc_handle.cpp" \
    "$src/csrc/multidevice/"
  "$python" "$ipc/integrations/nvfuser/main/symmetric_overlay.py" "$src" >>"$log" 2>&1 ||
    die "symmetric_overlay.py"
  mark swap
  say "swapped in the drop-in (integrations/nvfuser/main/ipc_handle.{h,cpp}) and the SymmetricTensor overlay"
fi
build ours
stash ours
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$res/gpu.txt" 2>&1
# The host-IR loops timed on a quiet machine, before the test runs: stock and ours in turn.
for world in $DRIVER_WORLDS; do
  for label in ${BUILDS:-stock ours}; do
    done_ "driver-$label-w$world" && continue
    need $((${DRIVER_TIMEOUT:-300} / 2))
    run_driver "$label" "$world" || say "driver $label at W=$world: a rank failed (see driver-$label-w$world.log)"
    mark "driver-$label-w$world"
  done
done
multi_rank
multi_rank_alone
[ "$SINGLE_RANK" = 1 ] && single_rank

# ---- report ---------------------------------------------------------------------------------
OUT="$OUT" "$python" - "$res" >"$OUT/nvfuser-main-suite.md" <<'EOF' || die "report"
import glob, os, re, sys
res = sys.argv[1]
line = re.compile(r'^\[\s*(OK|FAILED|SKIPPED)\s*\] (\S+\.\S+) \((\d+) ms\)')
run = re.compile(r'^\[ RUN      \] (\S+)')
def parse(files):
    out = {}
    for f in files:
        started = []
        for l in open(f, errors='replace'):
            m = run.match(l)
            if m:
                started.append(m.group(1)); continue
            m = line.match(l)
            if m:
                out[m.group(2)] = ({'OK': 'pass', 'FAILED': 'FAIL', 'SKIPPED': 'skip'}[m.group(1)], int(m.group(3)))
        for t in started:
            out.setdefault(t, ('died', None))   # started, never finished: crash or timeout
    return out
def merge_ranks(per_rank):
    tests = sorted(set().union(*per_rank))
    out = {}
    for t in tests:
        rs = [p.get(t, ('not run', None)) for p in per_rank]
        st = [r[0] for r in rs]
        if all(s == st[0] for s in st): s = st[0]
        else: s = '/'.join(st)
        ms = [r[1] for r in rs if r[1] is not None]
        out[t] = (s, max(ms) if ms else None)
    return out
def fmt(r):
    if r is None: return 'not run'
    s, ms = r
    return s if ms is None else f'{s} ({ms} ms)'
print('# nvFuser main suite: stock vs drop-in\n')
gpu = open(os.path.join(res, 'gpu.txt')).read().strip() if os.path.exists(os.path.join(res, 'gpu.txt')) else '?'
print(f'GPU: {gpu}\n')
print('## Several ranks on one GPU\n')
print('Each rank its own node (`LOCAL_RANK=0`, `NCCL_HOSTID` per rank), every test in processes of')
print('its own; a row is the outcome on every rank (`a/b` when the ranks differ).\n')
print('| test | ranks | GPUs | stock | ours |\n|---|---|---|---|---|')
for wdir in sorted(glob.glob(f'{res}/mr/w*'), key=lambda d: int(d.rsplit('w', 1)[1])):
    world = int(wdir.rsplit('w', 1)[1])
    mr = {}
    for l in ('stock', 'ours'):
        per_rank = [parse(sorted(glob.glob(f'{wdir}/*-{l}-rank{r}.txt'))) for r in range(world)]
        mr[l] = merge_ranks(per_rank)
    lf = os.path.join(res, f'mr-list-w{world}.txt')
    listed = [l.strip() for l in open(lf) if l.strip()] if os.path.exists(lf) else []
    for t in sorted(set(mr['stock']) | set(mr['ours']) | set(listed)):
        print(f'| `{t}` | {world} | 1 | {fmt(mr["stock"].get(t))} | {fmt(mr["ours"].get(t))} |')
alone = sorted(glob.glob(f'{res}/mr-alone/w*'), key=lambda d: int(d.rsplit('w', 1)[1]))
if alone:
    print('\n## Run again alone (no other test on the machine)\n')
    print('| test | ranks | GPUs | stock | ours |\n|---|---|---|---|---|')
    for wdir in alone:
        world = int(wdir.rsplit('w', 1)[1])
        got = {}
        for l in ('stock', 'ours'):
            got[l] = merge_ranks([parse(sorted(glob.glob(f'{wdir}/*-{l}-rank{r}.txt'))) for r in range(world)])
        for t in sorted(set(got['stock']) | set(got['ours'])):
            print(f'| `{t}` | {world} | 1 | {fmt(got["stock"].get(t))} | {fmt(got["ours"].get(t))} |')
drivers = sorted(glob.glob(os.path.join(os.environ.get('OUT', '.'), 'driver-*.log')))
if drivers:
    print('\n## Host-IR loops timed inside nvFuser (nvfipc_main_driver)\n')
    print('| scenario | ranks | build | status | median per iteration | p90 | exchange part (median) |')
    print('|---|---|---|---|---|---|---|')
    for f in drivers:
        label = os.path.basename(f)[len('driver-'):].split('-w')[0]
        for l in open(f, errors='replace'):
            if not l.startswith('RESULT '): continue
            kv = dict(x.split('=', 1) for x in l.split()[1:] if '=' in x)
            ex = kv.get('exchange_median_us')
            print(f"| {kv.get('scenario')} | {kv.get('world')} | {label} | {kv.get('status')} | "
                  f"{kv.get('median_us')} us | {kv.get('p90_us')} us | {ex + ' us' if ex else ''} |")
print('\n## One rank\n')
sr = {l: parse(sorted(glob.glob(f'{res}/test-{l}-*.txt'))) for l in ('stock', 'ours')}
for l in ('stock', 'ours'):
    c = {}
    for s, _ in sr[l].values(): c[s] = c.get(s, 0) + 1
    print(f'- {l}: ' + ', '.join(f'{k} {v}' for k, v in sorted(c.items())))
diff = [t for t in sorted(set(sr['stock']) | set(sr['ours']))
        if (sr['stock'].get(t, ('not run',))[0] != sr['ours'].get(t, ('not run',))[0])]
print(f'- tests whose outcome differs: {len(diff)}\n')
print('| test | stock | ours |\n|---|---|---|')
for t in sorted(set(sr['stock']) | set(sr['ours'])):
    print(f'| `{t}` | {fmt(sr["stock"].get(t))} | {fmt(sr["ours"].get(t))} |')
EOF
"$python" "$repo/scripts/nvfuser/exit_noise.py" "$res" >>"$OUT/nvfuser-main-suite.md" || die "exit report"
cp "$res/configure.txt" "$OUT/" 2>/dev/null
pack
say "DONE: $OUT/nvfuser-main-suite.md"
