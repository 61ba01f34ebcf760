#!/usr/bin/env bash
# One GPU-machine round in a few back-to-back calls, each well under one command's 10-minute
# limit: the library's benchmarks on a quiet machine, then nvFuser main's suite
# (scripts/nvfuser/main-suite.sh) building and running in a process session of its own, which
# outlives the call, while the library's GPU checks run beside the build. Run from the repository
# root with target/release/{libnvfuser_ipc.so,nvfipc} prebuilt and .nvf-main/ prepared
# (scripts/nvfuser/main-prepare.sh); no cargo or network on the GPU machine.
#
#   bash scripts/gpu/round.sh start     benchmarks, then the suite launched, then the checks
#   bash scripts/gpu/round.sh wait      waits for the suite (at most ROUND_WAIT s), its progress
#   bash scripts/gpu/round.sh collect   whatever is there packed into $OUT/round.tgz
#
# `start` and `wait` also pack what is there when they return, so a machine lost between calls
# costs only the work after the last call. Environment:
#   ROUND_DIR     state and results on the GPU machine, outside the tree the device tool replaces
#                 at each call (default /root/nvfipc-round)
#   ROUND_WAIT    seconds `wait` waits at most (default 560)
#   PERF_RUNS     the benchmarks of `start` (scripts/gpu/perf-check.sh; default below)
#   STAGES        the checks of `start` (scripts/gpu/campaign.sh; default below)
#   NVF_MAIN=0    no nvFuser suite
#   main-suite.sh's own settings pass through; where unset, a round uses the defaults below:
#   the timed loops at W = 2, 4, 8; the multi-rank tests at most 16 processes at once (24 ran
#   short of GPU memory), the batched-memcpy collectives at one size (the others fail alike in
#   both builds, and each failure holds its peers for the whole time limit), the tests that
#   concurrent stock jobs broke run again alone; the one-rank run over the tests that reach IPC
#   or symmetric memory.
set -uo pipefail
cd "$(dirname "$0")/../.."
R="${ROUND_DIR:-/root/nvfipc-round}"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$R/out" "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
suite_log="$R/out/nvf-main.log"
export DRIVER_WORLDS="${DRIVER_WORLDS:-2 4 8}" MR_PROCS="${MR_PROCS:-16}"
export MR_TEST_TIMEOUT="${MR_TEST_TIMEOUT:-75}" SINGLE_RANK="${SINGLE_RANK:-1}"
export MR_FILTER="${MR_FILTER:-MultiDeviceTest.ShareIpcMemHandles:P2PCommunicationTest.*:P2PCommHostIrTest.*:SymmetricTensorTest.*:AlltoallvCudaTest.*:MultiDeviceHostIrTest.SymmetricContiguousView:StreamParallelBackendTest.*:MultiDeviceStreamParallelTypeTest.AllgatherInterStreamSyncNoWrap:RingAllgatherOverlapTest.*:RSMatmulTest.ReduceScatterP2p*:DispatchCombine*:TmaTest.*:LowerCollectiveCudaAndNcclTest.*batch_memcpy_128KB}"
# Besides the two that allocate on cuda:<rank> themselves, AllgatherP2p does too (both builds:
# "invalid device ordinal" with one GPU).
export MR_EXCLUDE="${MR_EXCLUDE:-SymmetricTensorTest.PreallocatedTensor:SymmetricTensorTest.ContiguousView:StreamParallelBackendTest.AllgatherP2p/*}"
export MR_ALONE="${MR_ALONE:-2:SymmetricTensorTest.SmallAllocation 2:DispatchCombineBackends/DispatchCombineTest.DispatchOnlyTop1/1 4:DispatchCombineBackends/DispatchCombineTest.CombineOnlyTop1/1 2:StreamParallelBackendTest.AG_matmul_P2p/p2p_Cuda 2:RSMatmulTest.ReduceScatterP2p/CUDA}"
export SR_FILTER="${SR_FILTER:-MultiDeviceTest.*:P2PCommunicationTest.*:P2PCommHostIrTest.*:SymmetricTensorTest.*:AlltoallvCudaTest.*:MultiDeviceHostIrTest.*:StreamParallelBackendTest.*:RingAllgatherOverlapTest.*:RSMatmulTest.*:DispatchCombine*:TmaTest.*}"

pack() {
  tar -czf "$OUT/round.tgz" -C "$R/out" . 2>/dev/null
  for f in perf/perf.txt campaign/campaign.txt nvf-main/nvfuser-main-suite.md; do
    [ -f "$R/out/$f" ] && cp "$R/out/$f" "$OUT/"
  done
  tail -n 40 "$suite_log" 2>/dev/null >"$OUT/nvf-main-tail.txt"
  true
}

suite_state() {
  if grep -q 'nvfuser-main-suite: DONE' "$suite_log" 2>/dev/null; then
    echo done
  elif grep -q 'nvfuser-main-suite: FAILED' "$suite_log" 2>/dev/null; then
    echo failed
  elif [ -f "$R/suite.pid" ] && kill -0 "$(cat "$R/suite.pid")" 2>/dev/null; then
    echo running
  else
    echo absent
  fi
}

start() {
  [ -x target/release/nvfipc ] || { echo "round: target/release/nvfipc missing" >&2; exit 1; }
  # 1. Benchmarks first, while nothing else runs.
  OUT="$R/out/perf" PERF_RUNS="${PERF_RUNS:-exchange exchange-vmm post scale symmetric-vmm torch-symm}" \
    bash scripts/gpu/perf-check.sh >"$R/out/perf.log" 2>&1
  echo "== perf: rc=$?"
  cat "$R/out/perf/perf.txt" 2>/dev/null
  # 2. nvFuser main's suite from a copy of the tree (the device tool replaces the tree at each
  #    call; a running script must not be rewritten under it), in a session of its own.
  if [ "${NVF_MAIN:-1}" = 1 ] && [ "$(suite_state)" = absent ]; then
    rm -rf "$R/tree" && mkdir -p "$R/tree"
    tar -cf - --exclude=./build --exclude=./target --exclude=./gpu-out . | tar -xf - -C "$R/tree"
    (cd "$R/tree" && setsid nohup env BUDGET=100000 WORK="$R/nvf-work" OUT="$R/out/nvf-main" \
      bash scripts/nvfuser/main-suite.sh >"$suite_log" 2>&1 </dev/null &
      echo $! >"$R/suite.pid")
    echo "== nvFuser main suite started (pid $(cat "$R/suite.pid"))"
  fi
  # 3. The library's GPU checks beside the build (correctness only; no timings asserted).
  OUT="$R/out" STAGES="${STAGES:-gpu-check cxx lifecycle symmetric}" \
    bash scripts/gpu/campaign.sh >"$R/out/campaign.log" 2>&1
  echo "== campaign: rc=$?"
  cat "$R/out/campaign/campaign.txt" 2>/dev/null
  echo "== suite: $(suite_state)"
  tail -n 5 "$suite_log" 2>/dev/null
  pack
}

wait_suite() {
  local t0 limit="${ROUND_WAIT:-560}"
  t0=$(date +%s)
  while [ "$(suite_state)" = running ] && [ $(($(date +%s) - t0)) -lt "$limit" ]; do
    sleep 5
  done
  echo "== suite: $(suite_state) after $(($(date +%s) - t0)) s of waiting"
  grep 'nvfuser-main-suite:' "$suite_log" | tail -n 25
  pack
}

case "${1:-}" in
  start) start ;;
  wait) wait_suite ;;
  collect) pack && ls -la "$OUT" ;;
  *) echo "usage: $0 start|wait|collect" >&2; exit 2 ;;
esac
