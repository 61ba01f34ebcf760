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
# `start` and `wait` also pack what is there when they return (the suites' raw results so far
# included), so a machine lost between calls costs only the work after the last call. Environment:
#   ROUND_DIR     state and results on the GPU machine, outside the tree the device tool replaces
#                 at each call (default /root/nvfipc-round)
#   ROUND_WAIT    seconds `wait` waits at most (default 560)
#   PERF_RUNS     the benchmarks of `start` (scripts/gpu/perf-check.sh; default below: all but
#                 PyTorch's symmetric memory, which refuses ranks that share a GPU)
#   STAGES        the checks of `start` (scripts/gpu/campaign.sh; default below)
#   ROUND_PERF=0, ROUND_CHECKS=0  leave the benchmarks or the checks out of `start`
#   NVF_SUITE     the nvFuser suites: main (scripts/nvfuser/main-suite.sh, the default), seed
#                 (scripts/nvfuser/suite.sh), both ("seed main": the second builds at nice 10
#                 beside the first) or none
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
for suite in $NVF_SUITE; do
  case "$suite" in
    main | seed | none) ;;
    *) echo "round: NVF_SUITE=$NVF_SUITE: expected main, seed, \"seed main\" or none" >&2; exit 2 ;;
  esac
done
[ "$NVF_SUITE" = none ] && NVF_SUITE=""
suite_script() { [ "$1" = main ] && echo main-suite.sh || echo suite.sh; }
suite_name() { [ "$1" = main ] && echo nvfuser-main-suite || echo nvfuser-suite; }
suite_log() { echo "$R/out/nvf-$1.log"; }
export MR_PROCS="${MR_PROCS:-16}" MR_TEST_TIMEOUT="${MR_TEST_TIMEOUT:-75}"
if [[ " $NVF_SUITE " == *" main "* ]]; then
  export DRIVER_WORLDS="${DRIVER_WORLDS-2 4 8}"
  export SINGLE_RANK="${SINGLE_RANK:-1}"
  export MR_FILTER="${MR_FILTER:-MultiDeviceTest.ShareIpcMemHandles:P2PCommunicationTest.*:P2PCommHostIrTest.*:SymmetricTensorTest.*:AlltoallvCudaTest.*:MultiDeviceHostIrTest.SymmetricContiguousView:StreamParallelBackendTest.*:MultiDeviceStreamParallelTypeTest.AllgatherInterStreamSyncNoWrap:RingAllgatherOverlapTest.*:RSMatmulTest.ReduceScatterP2p*:DispatchCombine*:TmaTest.*:LowerCollectiveCudaAndNcclTest.*batch_memcpy_128KB}"
  # Besides the two that allocate on cuda:<rank> themselves, AllgatherP2p does too (both builds:
  # "invalid device ordinal" with one GPU).
  export MR_EXCLUDE="${MR_EXCLUDE:-SymmetricTensorTest.PreallocatedTensor:SymmetricTensorTest.ContiguousView:StreamParallelBackendTest.AllgatherP2p/*}"
  # The W = 4 AG_matmul_P2p tests start together in the concurrent pass: 16 processes of about
  # 9 GiB each may not fit one 80 GiB card, so they run alone as well.
  export MR_ALONE="${MR_ALONE-2:SymmetricTensorTest.SmallAllocation 2:DispatchCombineBackends/DispatchCombineTest.DispatchOnlyTop1/1 4:DispatchCombineBackends/DispatchCombineTest.CombineOnlyTop1/1 2:StreamParallelBackendTest.AG_matmul_P2p/p2p_Cuda 2:RSMatmulTest.ReduceScatterP2p/CUDA 4:StreamParallelBackendTest.AG_matmul_P2p/p2p_Cuda 4:StreamParallelBackendTest.AG_matmul_P2p/p2p_Nccl 4:StreamParallelBackendTest.AG_matmul_P2p/Broadcast_Nccl}"
  export SR_FILTER="${SR_FILTER:-MultiDeviceTest.*:P2PCommunicationTest.*:P2PCommHostIrTest.*:SymmetricTensorTest.*:AlltoallvCudaTest.*:MultiDeviceHostIrTest.*:StreamParallelBackendTest.*:RingAllgatherOverlapTest.*:RSMatmulTest.*:DispatchCombine*:TmaTest.*}"
fi

pack() {
  local suite
  # Each suite's raw results so far (every finished test's rank logs and exit codes), not only
  # once it is over: a machine lost or a device budget spent between calls keeps what ran.
  for suite in $NVF_SUITE; do
    [ -d "$R/nvf-$suite-work/results" ] &&
      tar -czf "$R/out/nvf-$suite-results.tgz" -C "$R/nvf-$suite-work" results 2>/dev/null
  done
  tar -czf "$OUT/round.tgz" -C "$R/out" . 2>/dev/null
  [ -f "$R/out/perf/perf.txt" ] && cp "$R/out/perf/perf.txt" "$OUT/"
  [ -f "$R/out/campaign.txt" ] && cp "$R/out/campaign.txt" "$OUT/"
  for suite in $NVF_SUITE; do
    [ -f "$R/out/nvf-$suite/$(suite_name "$suite").md" ] && cp "$R/out/nvf-$suite/$(suite_name "$suite").md" "$OUT/"
    tail -n 40 "$(suite_log "$suite")" 2>/dev/null >"$OUT/nvf-$suite-tail.txt"
  done
  true
}

suite_state() { # SUITE
  local name log
  name="$(suite_name "$1")" log="$(suite_log "$1")"
  if grep -q "$name: DONE" "$log" 2>/dev/null; then
    echo "done"
  elif grep -q "$name: FAILED" "$log" 2>/dev/null; then
    echo "failed"
  # By name: setsid forks when its caller leads a process group, so no pid is kept.
  elif pgrep -f "scripts/nvfuser/$(suite_script "$1")" >/dev/null; then
    echo running
  else
    echo absent
  fi
}

any_running() {
  local suite
  for suite in $NVF_SUITE; do [ "$(suite_state "$suite")" = running ] && return 0; done
  return 1
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
  # 2. The nvFuser suites from a copy of the tree (the device tool replaces the tree at each
  #    call; a running script must not be rewritten under it), each in a session of its own; a
  #    suite after the first builds at a lower priority, so that the first finishes as if alone
  #    and the next takes the processors its tests leave.
  local suite nice_level=0
  for suite in $NVF_SUITE; do
    if [ "$(suite_state "$suite")" = absent ]; then
      rm -rf "$R/tree-$suite" && mkdir -p "$R/tree-$suite"
      tar -cf - --exclude=./build --exclude=./target --exclude=./gpu-out . | tar -xf - -C "$R/tree-$suite"
      # Every descriptor of the launching subshell goes to the log as well: a caller that reads
      # this call's output to its end (`round.sh start | tail`) must not wait for the suite.
      (cd "$R/tree-$suite" && exec setsid nohup nice -n "$nice_level" env BUDGET=100000 \
        WORK="$R/nvf-$suite-work" OUT="$R/out/nvf-$suite" bash "scripts/nvfuser/$(suite_script "$suite")") \
        >"$(suite_log "$suite")" 2>&1 </dev/null &
      sleep 2
      echo "== nvFuser $suite suite: $(suite_state "$suite") (nice $nice_level)"
    fi
    nice_level=10
  done
  # 3. The library's GPU checks beside the build (correctness only; no timings asserted).
  if [ "${ROUND_CHECKS:-1}" = 1 ]; then
    OUT="$R/out" STAGES="${STAGES:-gpu-check cxx lifecycle symmetric}" \
      bash scripts/gpu/campaign.sh >"$R/out/campaign.log" 2>&1
    echo "== campaign: rc=$?"
    cat "$R/out/campaign.txt" 2>/dev/null
  fi
  for suite in $NVF_SUITE; do
    echo "== $suite suite: $(suite_state "$suite")"
    tail -n 5 "$(suite_log "$suite")" 2>/dev/null
  done
  pack
}

wait_suite() {
  local t0 limit="${ROUND_WAIT:-560}" suite
  t0=$(date +%s)
  while any_running && [ $(($(date +%s) - t0)) -lt "$limit" ]; do
    sleep 5
  done
  for suite in $NVF_SUITE; do
    echo "== $suite suite: $(suite_state "$suite") after $(($(date +%s) - t0)) s of waiting"
    grep "$(suite_name "$suite"):" "$(suite_log "$suite")" 2>/dev/null | tail -n 25
  done
  pack
}

case "${1:-}" in
  start) start ;;
  wait) wait_suite ;;
  collect) pack && ls -la "$OUT" ;;
  *) echo "usage: $0 start|wait|collect" >&2; exit 2 ;;
esac
