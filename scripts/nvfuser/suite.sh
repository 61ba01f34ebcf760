#!/usr/bin/env bash
# nvFuser's own multidevice suite, stock beside the drop-in, on a GPU machine without network or
# cargo. Run from the repository root; resumable: every call continues where the last stopped
# and returns before its time budget, so a build longer than one command's limit is finished by
# calling it again (the work directory survives between calls on the same machine).
#
#   bash scripts/nvfuser/suite.sh            # repeat until it prints "nvfuser-suite: DONE"
#
# Inputs, prepared where cargo and the network are (scripts/nvfuser/prepare.sh):
#   NVF_TAR   nvFuser at 3fe1c32124ea83f90253496cecbe5becf46c9df0 with its submodules flatbuffers,
#             googletest and benchmark, as a .tar.xz (default .nvf/nvfuser-seed.tar.xz)
#   NVF_LIB   a directory holding libnvfuser_ipc.so (default .nvf/lib)
# Settings:
#   WORK      work directory (default build/nvfuser-suite): sources, the build, results
#   BUDGET    seconds this call may use (default 570)
#   SHARDS    parallel single-rank shards per build of test_multidevice (default 6)
#   TEST_TIMEOUT  seconds for the single-rank runs, all shards of both builds at once (default 300)
#   DRIVER_RANKS  process counts for the host-IR driver (default "2 4 8"; "" skips it)
#   SINGLE_RANK   1 (default): also every test of test_multidevice with one rank; 0 skips that
#   BUILDS    the builds made and run (default "stock ours"); "ours" builds and runs the drop-in
#             alone, for a run whose stock results are on record (the report says "not run")
#   MR_WORLDS, MR_FILTER, MR_WIDE_FILTER, MR_EXCLUDE, MR_TEST_TIMEOUT, MR_PROCS  the tests run
#             with several ranks on the one GPU (scripts/lib/multi-rank-tests.sh; defaults below;
#             MR_WORLDS="" skips them)
#
# Steps (a marker file under $WORK/state records each one done):
#   unpack     sources to $WORK/src; nvFuser's own ipc_handle.{h,cpp} kept in $WORK/stock; two
#              lines appended to nvFuser's CMakeLists.txt: include() of
#              integrations/nvfuser/nvfuser_ipc.cmake (links the library; nvFuser's stock
#              sources do not use it) and of integrations/nvfuser/hostir_driver/hostir_driver.cmake
#   configure  Ninja, no optimisation (CMAKE_BUILD_TYPE empty: -O0, as measured to fit the
#              device limits), USE_DISTRIBUTED/NVFUSER_DISTRIBUTED/BUILD_TEST/BUILD_PYTHON on;
#              on CUDA 13 integrations/nvfuser/seed-compat/cuda13_pfn.h is force-included
#   patch-executor  one line of csrc/host_ir/executor.cpp (see patch_executor below)
#   patch-tests  MultiDeviceTest.ShareIpcMemHandles and P2PCommunicationTest.CudaComm skip unless
#              there are 2 GPUs; the GPU-count half of that check is dropped (in both builds) so
#              that several ranks on one GPU run them (CUDA IPC between processes on one device
#              works); IpcTest.* select device <global rank>, patched to the local rank, and
#              free their exported buffer before the peer may have opened it, patched with a
#              barrier before their clean-up
#   build-stock, stash-stock  nvFuser's own ipc_handle.{h,cpp}; binaries copied to $WORK/bin-stock
#   swap       integrations/nvfuser/ipc_handle.{h,cpp} copied over them (ninja then rebuilds
#              only their includers and relinks)
#   build-ours, stash-ours    the drop-in; binaries copied to $WORK/bin-ours
#   driver-stock-W, driver-ours-W  the host-IR driver with W = 2, 4, 8 processes on the GPU, each
#              its own host to NCCL (NCCL_HOSTID), so stock's NCCL world barrier runs too
#   mr         the tests of MR_FILTER with W ranks on the one GPU (W in MR_WORLDS), each rank a
#              node of its own with its own NCCL_HOSTID, every test in processes of its own, stock
#              and ours side by side (scripts/lib/multi-rank-tests.sh)
#   tests      test_multidevice with one rank, stock and ours side by side
#   report     $OUT/nvfuser-suite.md (one row per test: stock, ours; which processes printed
#              store or library warnings, scripts/nvfuser/exit_noise.py) and the raw logs
set -uo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
start_s=$(date +%s)
BUDGET="${BUDGET:-570}"
NVF_TAR="${NVF_TAR:-.nvf/nvfuser-seed.tar.xz}"
NVF_LIB="${NVF_LIB:-.nvf/lib}"
WORK="${WORK:-build/nvfuser-suite}"
SHARDS="${SHARDS:-6}"
TEST_TIMEOUT="${TEST_TIMEOUT:-300}"
DRIVER_RANKS="${DRIVER_RANKS-2 4 8}"
MR_WORLDS="${MR_WORLDS-2 4}"
MR_TEST_TIMEOUT="${MR_TEST_TIMEOUT:-90}"
MR_PROCS="${MR_PROCS:-24}"
# The tests that reach IpcHandleCache or raw CUDA IPC at this commit (no CUDA-backend ring test
# exists here yet), and the P2P host-IR tests beside them.
MR_FILTER="${MR_FILTER:-MultiDeviceTest.ShareIpcMemHandles:P2PCommunicationTest.*:IpcTest.*:StreamOpTest.*:P2PCommHostIrTest.*:MultiDeviceHostIrTest.*:RingAllgatherOverlapTest.*}"
MR_WIDE_FILTER="${MR_WIDE_FILTER:-$MR_FILTER}"
MR_EXCLUDE="${MR_EXCLUDE:-}"
NO_MCAST=""
OUT="${OUT:-$WORK/out}"
mkdir -p "$WORK/state" "$WORK/results" "$OUT"
WORK="$(cd "$WORK" && pwd)"
OUT="$(cd "$OUT" && pwd)"
NVF_LIB="$(cd "$NVF_LIB" && pwd)"
src="$WORK/src"
bld="$WORK/build"
res="$WORK/results"
log="$OUT/nvfuser-suite.log"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

STEPS_NAME=nvfuser-suite
# shellcheck source=../lib/resumable-steps.sh
. "$repo/scripts/lib/resumable-steps.sh"

python="$(command -v python3)"
torch_dir="$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')" ||
  die "python3 cannot import torch"

# ---- unpack ---------------------------------------------------------------------------------
[ -f "$NVF_TAR" ] || die "$NVF_TAR missing: run scripts/nvfuser/prepare.sh where the network is"
tar_sum="$(sha256sum "$NVF_TAR" | cut -d' ' -f1)"
if [ "$(cat "$WORK/state/sources" 2>/dev/null)" != "$tar_sum" ]; then
  rm -rf "$WORK/state" "$bld" # other sources: start over
  mkdir -p "$WORK/state"
fi
# RERUN="step ...": forget that these steps were done, with their parts (e.g. "build-ours
# stash-ours driver-ours"; "mr" runs every several-rank test again).
# shellcheck disable=SC2086 # RERUN is a list of step names
forget_steps ${RERUN:-}
# ONLY_IF_BUILT=1: do nothing on a machine that does not hold the builds (a fresh one).
if [ -n "${ONLY_IF_BUILT:-}" ] && ! done_ stash-ours; then
  die "ONLY_IF_BUILT: this machine holds no build"
fi
if ! done_ unpack; then
  [ -f "$NVF_LIB/libnvfuser_ipc.so" ] || die "$NVF_LIB/libnvfuser_ipc.so missing"
  rm -rf "$src" "$WORK/stock"
  mkdir -p "$src" "$WORK/stock"
  tar -xJf "$NVF_TAR" -C "$src" || die "unpacking $NVF_TAR"
  cp "$src/csrc/multidevice/ipc_handle.h" "$src/csrc/multidevice/ipc_handle.cpp" "$WORK/stock/"
  # Every compile force-includes the shim (on CUDA 13): a copy made once keeps its time stamp,
  # so a fresh copy of this repository does not make ninja rebuild everything.
  mkdir -p "$WORK/compat"
  cp "$repo/integrations/nvfuser/seed-compat/cuda13_pfn.h" "$WORK/compat/"
  {
    echo ""
    echo "include(\"$repo/integrations/nvfuser/nvfuser_ipc.cmake\")"
    echo "include(\"$repo/integrations/nvfuser/hostir_driver/hostir_driver.cmake\")"
  } >>"$src/CMakeLists.txt"
  mark unpack
  echo "$tar_sum" >"$WORK/state/sources"
  say "unpacked $(du -sh "$src" | cut -f1) of sources"
fi

# ---- configure ------------------------------------------------------------------------------
if ! done_ configure; then
  need 120
  cuda_inc=/usr/local/cuda/include
  cxx_flags="-Wno-psabi"
  if ! grep -qE '(define|typedef).*PFN_cuGetErrorString[^_]' "$cuda_inc/cudaTypedefs.h"; then
    cxx_flags="$cxx_flags -include $WORK/compat/cuda13_pfn.h -Wno-error=deprecated-declarations"
    say "CUDA headers without unversioned PFN_cu* typedefs: force-including the seed compat shim"
  fi
  pybind_dir="$("$python" -c 'import pybind11; print(pybind11.get_cmake_dir())' 2>/dev/null)"
  timeout "$(left)" cmake -S "$src" -B "$bld" -G Ninja \
    -DCMAKE_PREFIX_PATH="$torch_dir/share/cmake" \
    -DPython_EXECUTABLE="$python" ${pybind_dir:+-Dpybind11_DIR="$pybind_dir"} \
    -DUSE_DISTRIBUTED=ON -DNVFUSER_DISTRIBUTED=ON -DBUILD_TEST=ON -DBUILD_PYTHON=ON \
    -DBUILD_NVFUSER_BENCHMARK=OFF -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
    -DCMAKE_CXX_FLAGS="$cxx_flags" \
    -DNVFUSER_IPC_SOURCE_DIR="$repo" -DNVFIPC_PREBUILT_LIB_DIR="$NVF_LIB" \
    >"$res/configure.txt" 2>&1 || { tail -40 "$res/configure.txt"; die "configure"; }
  mark configure
  say "configured"
fi

build() { # label
  local label="$1"
  done_ "build-$label" && return 0
  need 60
  local t0=$(date +%s)
  # -k 0: a failing driver must not stop nvFuser's own test binary from building.
  timeout $(($(left) - 20)) ninja -C "$bld" -j16 -k 0 test_multidevice nvfipc_hostir_driver \
    >"$res/build-$label.txt" 2>&1
  local rc=$?
  say "build-$label: ninja rc=$rc after $(($(date +%s) - t0)) s"
  if [ "$rc" -eq 124 ]; then
    say "RESUME: the build continues in the next call"
    pack
    exit 0
  fi
  if [ "$rc" -ne 0 ]; then
    grep -m5 -B2 -A12 'error' "$res/build-$label.txt" | head -80
    die "build-$label (log: build-$label.txt in nvfuser-suite-logs.tgz)"
  fi
  local warnings
  warnings=$(grep -cE 'warning:' "$res/build-$label.txt")
  say "build-$label: done, $warnings compiler warning lines"
  mark "build-$label"
}

# One rank, all of test_multidevice, stock and ours at the same time: $SHARDS processes each
# on the one GPU (gtest sharding), every shard a world of its own.
single_rank_tests() {
  done_ tests && return 0
  need $((TEST_TIMEOUT + 20))
  local t0=$(date +%s) pids=() names=() i label bin port=29600
  for label in ${BUILDS:-stock ours}; do
    bin="$WORK/bin-$label/test_multidevice"
    for ((i = 0; i < SHARDS; i++)); do
      port=$((port + 1)) # here, not inside the backgrounded command (a subshell)
      env WORLD_RANK=0 WORLD_SIZE=1 WORLD_LOCAL_RANK=0 WORLD_LOCAL_SIZE=1 \
        NVFUSER_MASTER_PORT="$port" NVFIPC_TIMEOUT_MS=60000 \
        GTEST_TOTAL_SHARDS="$SHARDS" GTEST_SHARD_INDEX="$i" \
        timeout -k 5 "$TEST_TIMEOUT" "$bin" --gtest_color=no \
        >"$res/test-$label-$i.txt" 2>&1 &
      pids+=($!)
      names+=("$label/$i")
    done
  done
  local rcs=""
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rcs="$rcs ${names[$i]}=$?"
  done
  say "single-rank test_multidevice: exit codes:$rcs after $(($(date +%s) - t0)) s"
  mark tests
}

# The host-IR driver with W processes on the one GPU, each a node of its own.
driver() { # label W
  local label="$1" w="$2"
  done_ "driver-$label-$w" && return 0
  need 100
  local t0=$(date +%s) pids=() r rcs="" port=$((29700 + w))
  [ "$label" = stock ] && port=$((29800 + w))
  for ((r = 0; r < w; r++)); do
    local addr=127.0.0.1
    [ "$r" -eq 0 ] && addr=localhost
    # Each rank a host of its own to NCCL (stock's exchange ends with a NCCL world barrier,
    # and NCCL refuses two ranks of one host on one GPU).
    env WORLD_RANK="$r" WORLD_SIZE="$w" WORLD_LOCAL_RANK=0 WORLD_LOCAL_SIZE=1 \
      NVFUSER_MASTER_ADDR="$addr" NVFUSER_MASTER_PORT="$port" NVFIPC_TIMEOUT_MS=30000 \
      NCCL_HOSTID="nvfseed-driver-$label-w$w-rank$r" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
      NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 \
      timeout -k 5 90 "$WORK/bin-$label/nvfipc_hostir_driver" --iters 50 \
      >"$res/driver-$label-$w-rank$r.txt" 2>&1 &
    pids+=($!)
  done
  for r in "${!pids[@]}"; do
    wait "${pids[$r]}"
    rcs="$rcs $?"
    echo "rank $r exited at $(date +%s.%N)" >>"$res/driver-$label-$w-exit.txt"
  done
  say "driver-$label W=$w: exit codes:$rcs after $(($(date +%s) - t0)) s"
  grep -h '^TIMING\|FAIL\|exiting' "$res"/driver-"$label"-"$w"-rank*.txt | tee -a "$log"
  mark "driver-$label-$w"
}

# The binaries link codegen_internal's objects (nvFuser's tests do), so a copy keeps running
# after the sources change.
stash() { # label
  done_ "stash-$1" && return 0
  mkdir -p "$WORK/bin-$1"
  local b
  for b in test_multidevice nvfipc_hostir_driver; do
    cp "$(find "$bld" -maxdepth 2 -type f -name "$b" -print -quit)" "$WORK/bin-$1/" || die "stash $1: $b"
  done
  mark "stash-$1"
}

# nvFuser's HostIrEvaluator takes its default stream on device <global rank> (deviceId()),
# not <local rank>: with several ranks per GPU (or per node) rank >= 1 fails with "Device
# index value 1 is out of index range". One line of csrc/host_ir/executor.cpp is patched to use
# the local rank it already holds (my_local_device_index_); with one GPU per rank on one node
# (nvFuser's CI) both are equal.
patch_executor() {
  done_ patch-executor && return 0
  sed -i 's/getDefaultCUDAStream(\n\?\s*static_cast<c10::DeviceIndex>(device_index))/getDefaultCUDAStream(static_cast<c10::DeviceIndex>(my_local_device_index_))/' \
    "$src/csrc/host_ir/executor.cpp"
  perl -0pi -e 's/getDefaultCUDAStream\(\s*static_cast<c10::DeviceIndex>\(device_index\)\)/getDefaultCUDAStream(static_cast<c10::DeviceIndex>(my_local_device_index_))/' \
    "$src/csrc/host_ir/executor.cpp"
  grep -q 'getDefaultCUDAStream(static_cast<c10::DeviceIndex>(my_local_device_index_))' \
    "$src/csrc/host_ir/executor.cpp" || die "patching host_ir/executor.cpp"
  mark patch-executor
  say "patched host_ir/executor.cpp: default stream on the local device"
}

patch_tests() {
  done_ patch-tests && return 0
  perl -0pi -e 's/(TEST_F\(MultiDeviceTest, ShareIpcMemHandles\) \{.*?)if \(communicator_->size\(\) < 2 \|\| torch::cuda::device_count\(\) < 2\)/$1if (communicator_->size() < 2)/s' \
    "$src/tests/cpp/test_multidevice_host_ir.cpp"
  perl -0pi -e 's/(TEST_F\(P2PCommunicationTest, CudaComm\) \{.*?)if \(communicator_->size\(\) < 2 \|\| torch::cuda::device_count\(\) < 2\)/$1if (communicator_->size() < 2)/s' \
    "$src/tests/cpp/test_multidevice_communications.cpp"
  # IpcTest selects device <global rank> (cudaSetDevice(rank)): "invalid device ordinal" with
  # several ranks on one GPU; the local device, as every other test takes it, runs them there.
  perl -pi -e 's/cudaSetDevice\(rank\)/cudaSetDevice(communicator_->local_rank())/' \
    "$src/tests/cpp/test_multidevice_ipc.cpp"
  # They also free their exported buffer right after reading the peer's, with no barrier between
  # a peer's cudaIpcOpenMemHandle and that cudaFree (the fixture's barrier comes after): a rank
  # that is quicker than its peer frees the memory the peer is about to open ("invalid
  # argument"), in either build and at random (raw CUDA IPC, no ipc_handle.cpp involved). A
  # barrier before their clean-up closes that race.
  perl -0pi -e 's|(  // Clean up\n)(  NVFUSER_CUDA_RT_SAFE_CALL\(cudaIpcCloseMemHandle)|$1  communicator_->barrier();\n$2|g' \
    "$src/tests/cpp/test_multidevice_ipc.cpp"
  [ "$(grep -c 'cudaSetDevice(rank)' "$src/tests/cpp/test_multidevice_ipc.cpp")" = 0 ] &&
    [ "$(grep -c 'communicator_->barrier();' "$src/tests/cpp/test_multidevice_ipc.cpp")" = 6 ] ||
    die "patching test_multidevice_ipc.cpp"
  [ "$(grep -c 'device_count() < 2' "$src/tests/cpp/test_multidevice_host_ir.cpp")" = 0 ] ||
    die "patching test_multidevice_host_ir.cpp"
  [ "$(grep -c 'device_count() < 2' "$src/tests/cpp/test_multidevice_communications.cpp")" = 1 ] ||
    die "patching test_multidevice_communications.cpp"
  mark patch-tests
  say "patched: ShareIpcMemHandles and CudaComm need 2 ranks, not 2 GPUs; IpcTest on the local device, a barrier before its clean-up"
}

rank_env() { echo "WORLD_RANK=$1 WORLD_SIZE=$2 WORLD_LOCAL_RANK=0 WORLD_LOCAL_SIZE=1"; }
# shellcheck source=../lib/multi-rank-tests.sh
. "$repo/scripts/lib/multi-rank-tests.sh"

patch_executor
patch_tests
if builds_has stock; then
  build stock
  stash stock
fi
if ! done_ swap; then
  cp "$repo/integrations/nvfuser/ipc_handle.h" "$repo/integrations/nvfuser/ipc_handle.cpp" \
    "$src/csrc/multidevice/"
  mark swap
  say "swapped in the drop-in (integrations/nvfuser/ipc_handle.{h,cpp})"
fi
build ours
stash ours
# Stock and ours in turn at each process count (stock's NCCL barrier works with a NCCL_HOSTID
# per rank, see driver).
for w in $DRIVER_RANKS; do
  builds_has stock && driver stock "$w"
  driver ours "$w"
done
[ -n "$MR_WORLDS" ] && multi_rank
[ "${SINGLE_RANK:-1}" = 1 ] && single_rank_tests

# ---- report ---------------------------------------------------------------------------------
"$python" "$repo/scripts/nvfuser/suite-report.py" "$res" "$DRIVER_RANKS" >"$OUT/nvfuser-suite.md" ||
  die "report"
"$python" "$repo/scripts/nvfuser/exit_noise.py" "$res" >>"$OUT/nvfuser-suite.md" || die "exit report"
cp "$res"/configure.txt "$OUT/" 2>/dev/null
pack
say "DONE: $OUT/nvfuser-suite.md"
