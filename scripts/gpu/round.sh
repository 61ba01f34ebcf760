#!/usr/bin/env bash
# One GPU-machine round in a few back-to-back calls, each well under one command's 10-minute
# limit: the library's benchmarks on a quiet machine, then nvFuser main's suite
# (scripts/nvfuser/main-suite.sh) building and running in a process session of its own, which
# outlives the call, while the library's GPU checks run beside the build. Run from the repository
# root with target/release/{libnvfuser_ipc.so,nvfipc} prebuilt and the suite's inputs prepared
# (.nvf-main/ by scripts/nvfuser/main-prepare.sh, .nvf/ by scripts/nvfuser/prepare.sh for the
# seed); no cargo or network on the GPU machine.
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
#   PERF_RUNS     the benchmarks of `start` (scripts/gpu/perf-check.sh; default below: all but
#                 PyTorch's symmetric memory, which refuses ranks that share a GPU)
#   STAGES        the checks of `start` (scripts/gpu/campaign.sh; default below)
#   ROUND_PERF=0, ROUND_CHECKS=0  leave the benchmarks or the checks out of `start`
#   NVF_SUITE     the nvFuser suite: main (scripts/nvfuser/main-suite.sh, the default), seed
#                 (scripts/nvfuser/suite.sh) or none
#   the suite's own settings pass through; where unset, a round uses the defaults below (main:
#   the timed loops at W = 2, 4, 8; the multi-rank tests at most 16 processes at once (24 ran
#   short of GPU memory), the batched-memcpy collectives at one size (the others fail alike in
#   both builds, and each failure holds its peers for the whole time limit), the tests that
#   concurrent stock jobs broke run again alone; the one-rank run over the tests that reach IPC
#   or symmetric memory; the seed: at most 16 test processes, 75 s per test).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
R="${ROUND_DIR:-/root/nvfipc-round}"
OUT="${OUT:-$PWD/gpu-out}"
mkdir -p "$R/out" "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NVF_SUITE="${NVF_SUITE:-main}"
case "$NVF_SUITE" in
  main) suite_script=main-suite.sh suite_name=nvfuser-main-suite ;;
  seed) suite_script=suite.sh suite_name=nvfuser-suite ;;
  none) suite_script="" suite_name="" ;;
  *) echo "round: NVF_SUITE=$NVF_SUITE: expected main, seed or none" >&2; exit 2 ;;
esac
suite_log="$R/out/nvf-$NVF_SUITE.log"
export MR_PROCS="${MR_PROCS:-16}" MR_TEST_TIMEOUT="${MR_TEST_TIMEOUT:-75}"
if [ "$NVF_SUITE" = main ]; then
  export DRIVER_WORLDS="${DRIVER_WORLDS:-2 4 8}"
  export SINGLE_RANK="${SINGLE_RANK:-1}"
  export MR_FILTER="${MR_FILTER:-MultiDeviceTest.ShareIpcMemHandles:P2PCommunicationTest.*:P2PCommHostIrTest.*:SymmetricTensorTest.*:AlltoallvCudaTest.*:MultiDeviceHostIrTest.SymmetricContiguousView:StreamParallelBackendTest.*:MultiDeviceStreamParallelTypeTest.AllgatherInterStreamSyncNoWrap:RingAllgatherOverlapTest.*:RSMatmulTest.ReduceScatterP2p*:DispatchCombine*:TmaTest.*:LowerCollectiveCudaAndNcclTest.*batch_memcpy_128KB}"
  # Besides the two that allocate on cuda:<rank> themselves, AllgatherP2p does too (both builds:
  # "invalid device ordinal" with one GPU).
  export MR_EXCLUDE="${MR_EXCLUDE:-SymmetricTensorTest.PreallocatedTensor:SymmetricTensorTest.ContiguousView:StreamParallelBackendTest.AllgatherP2p/*}"
  export MR_ALONE="${MR_ALONE:-2:SymmetricTensorTest.SmallAllocation 2:DispatchCombineBackends/DispatchCombineTest.DispatchOnlyTop1/1 4:DispatchCombineBackends/DispatchCombineTest.CombineOnlyTop1/1 2:StreamParallelBackendTest.AG_matmul_P2p/p2p_Cuda 2:RSMatmulTest.ReduceScatterP2p/CUDA}"
  export SR_FILTER="${SR_FILTER:-MultiDeviceTest.*:P2PCommunicationTest.*:P2PCommHostIrTest.*:SymmetricTensorTest.*:AlltoallvCudaTest.*:MultiDeviceHostIrTest.*:StreamParallelBackendTest.*:RingAllgatherOverlapTest.*:RSMatmulTest.*:DispatchCombine*:TmaTest.*}"
fi

pack() {
  tar -czf "$OUT/round.tgz" -C "$R/out" . 2>/dev/null
  for f in perf/perf.txt campaign.txt "nvf-$NVF_SUITE/$suite_name.md"; do
    [ -f "$R/out/$f" ] && cp "$R/out/$f" "$OUT/"
  done
  tail -n 40 "$suite_log" 2>/dev/null >"$OUT/nvf-$NVF_SUITE-tail.txt"
  true
}

suite_state() {
  if [ -z "$suite_script" ]; then
    echo none
  elif grep -q "$suite_name: DONE" "$suite_log" 2>/dev/null; then
    echo "done"
  elif grep -q "$suite_name: FAILED" "$suite_log" 2>/dev/null; then
    echo "failed"
  # By name: setsid forks when its caller leads a process group, so no pid is kept.
  elif pgrep -f "scripts/nvfuser/$suite_script" >/dev/null; then
    echo running
  else
    echo absent
  fi
}

start() {
  [ -x target/release/nvfipc ] || { echo "round: target/release/nvfipc missing" >&2; exit 1; }
  # 1. Benchmarks first, while nothing else runs.
  if [ "${ROUND_PERF:-1}" = 1 ]; then
    OUT="$R/out/perf" PERF_RUNS="${PERF_RUNS:-exchange exchange-vmm post scale symmetric-vmm}" \
      bash scripts/gpu/perf-check.sh >"$R/out/perf.log" 2>&1
    echo "== perf: rc=$?"
    cat "$R/out/perf/perf.txt" 2>/dev/null
  fi
  # 2. The nvFuser suite from a copy of the tree (the device tool replaces the tree at each
  #    call; a running script must not be rewritten under it), in a session of its own.
  if [ "$(suite_state)" = absent ]; then
    rm -rf "$R/tree" && mkdir -p "$R/tree"
    tar -cf - --exclude=./build --exclude=./target --exclude=./gpu-out . | tar -xf - -C "$R/tree"
    # Every descriptor of the launching subshell goes to the log as well: a caller that reads
    # this call's output to its end (`round.sh start | tail`) must not wait for the suite.
    (cd "$R/tree" && exec setsid nohup env BUDGET=100000 WORK="$R/nvf-$NVF_SUITE-work" \
      OUT="$R/out/nvf-$NVF_SUITE" bash "scripts/nvfuser/$suite_script") >"$suite_log" 2>&1 \
      </dev/null &
    sleep 2
    echo "== nvFuser $NVF_SUITE suite: $(suite_state)"
  fi
  # 3. The library's GPU checks beside the build (correctness only; no timings asserted).
  if [ "${ROUND_CHECKS:-1}" = 1 ]; then
    OUT="$R/out" STAGES="${STAGES:-gpu-check cxx lifecycle symmetric}" \
      bash scripts/gpu/campaign.sh >"$R/out/campaign.log" 2>&1
    echo "== campaign: rc=$?"
    cat "$R/out/campaign.txt" 2>/dev/null
  fi
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
  grep "$suite_name:" "$suite_log" 2>/dev/null | tail -n 25
  # The suite's raw results too, when it is over.
  case "$(suite_state)" in
    done | failed) tar -czf "$R/out/nvf-$NVF_SUITE-results.tgz" -C "$R/nvf-$NVF_SUITE-work" results ;;
  esac
  pack
}

case "${1:-}" in
  start) start ;;
  wait) wait_suite ;;
  collect) pack && ls -la "$OUT" ;;
  *) echo "usage: $0 start|wait|collect" >&2; exit 2 ;;
esac
