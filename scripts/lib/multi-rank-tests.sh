# Several ranks on the one GPU, shared by the resumable nvFuser suites (scripts/nvfuser/suite.sh,
# scripts/nvfuser/main-suite.sh): nvFuser's test_multidevice run with W processes per build on
# one GPU, each rank a node of its own with its own NCCL_HOSTID (NCCL refuses two ranks of one
# host on one GPU, and nvFuser's test fixture runs a NCCL barrier after every test), rank 0
# hosting the Communicator's TCPStore. Source it after scripts/lib/resumable-steps.sh, with:
#   WORK, res           the suite's work and results directories ($WORK/bin-{stock,ours} hold
#                       the binaries)
#   BUILDS              the builds run side by side (default "stock ours"; "ours" runs the
#                       drop-in alone, for a run whose stock results are already on record)
#   MR_WORLDS, MR_FILTER, MR_WIDE_FILTER, MR_EXCLUDE, MR_TEST_TIMEOUT, MR_PROCS, NO_MCAST
#   rank_env RANK WORLD a function printing the rank's environment assignments in the names
#                       the nvFuser commit reads (main: RANK, WORLD_SIZE, LOCAL_RANK,
#                       LOCAL_WORLD_SIZE; the seed: WORLD_RANK, WORLD_SIZE, WORLD_LOCAL_RANK,
#                       WORLD_LOCAL_SIZE)
# Concurrent tests share the host: nvFuser main's stock SymmetricTensor names its Unix sockets
# after rank and tag only, so two stock tests with symmetric memory at once can collide
# ("Address already in use"); MR_PROCS=$((2 * W)) runs one test at a time.
# Results: $res/mr-list-wW.txt (the tests), $res/mr/wW/<n>-<build>-rank<r>.txt (each rank's
# output), $res/mr-exit.txt (exit codes per test); the same under mr-alone for MR_ALONE.

first_build() { set -- ${BUILDS:-stock ours}; echo "$1"; }
build_count() { set -- ${BUILDS:-stock ours}; echo "$#"; }
# Is LABEL one of the builds this run makes?
builds_has() { case " ${BUILDS:-stock ours} " in *" $1 "*) return 0 ;; esac; return 1; }

# Several ranks on the one GPU: every test of the list in processes of its own, at each world
# size of MR_WORLDS, stock and ours side by side (2 x W processes per test); a test that fails
# on one rank only leaves the others waiting in a rendezvous, so the limit (MR_TEST_TIMEOUT)
# costs that test alone. Tests run concurrently up to MR_PROCS processes. Resumable per test.
mr_test() { # world n test port [kind]  (kind: mr, or mr-alone for multi_rank_alone)
  local world="$1" n="$2" test="$3" port="$4" kind="${5:-mr}" label r pids=() names=()
  local dir="$res/$kind/w$world"
  for label in ${BUILDS:-stock ours}; do
    for ((r = 0; r < world; r++)); do
      local addr=127.0.0.1 p=$port
      [ "$r" -eq 0 ] && addr=localhost
      [ "$label" = ours ] && p=$((port + 1))
      # shellcheck disable=SC2046 # rank_env prints NAME=VALUE words
      env $(rank_env "$r" "$world") \
        NVFUSER_MASTER_ADDR="$addr" NVFUSER_MASTER_PORT="$p" NVFIPC_TIMEOUT_MS=30000 \
        NCCL_HOSTID="nvfmain-$label-w$world-$n-rank$r" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 \
        NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 \
        timeout -k 5 "$MR_TEST_TIMEOUT" "$WORK/bin-$label/test_multidevice" --gtest_color=no \
        --gtest_filter="$test" >"$dir/$n-$label-rank$r.txt" 2>&1 &
      pids+=($!)
      names+=("$label/rank$r")
    done
  done
  local rcs="" i
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rcs="$rcs ${names[$i]}=$?"
  done
  echo "$test w$world:$rcs" >>"$res/$kind-exit.txt"
  mark "$kind-w$world-$n"
}

# The tests of MR_ALONE ("W:test" words), each alone on the machine (no other test process at
# the same time), after multi_rank: for outcomes that concurrent tests may have changed (stock's
# socket names collide between concurrent jobs). Results under $res/mr-alone/wW/.
multi_rank_alone() {
  done_ mr-alone && return 0
  local item world test n=0 port=28000
  for item in ${MR_ALONE:-}; do
    world="${item%%:*}"
    test="${item#*:}"
    n=$((n + 1))
    port=$((port + 2))
    done_ "mr-alone-w$world-$n" && continue
    need $((MR_TEST_TIMEOUT + 15))
    mkdir -p "$res/mr-alone/w$world"
    echo "$test" >>"$res/mr-alone-list-w$world.txt"
    mr_test "$world" "$n" "$test" "$port" mr-alone </dev/null
  done
  mark mr-alone
}

multi_rank() {
  done_ mr && return 0
  need 60
  local world list
  for world in $MR_WORLDS; do
    list="$res/mr-list-w$world.txt"
    local filter="$MR_FILTER"
    [ "$world" -gt 2 ] && filter="$MR_WIDE_FILTER"
    filter="$filter-${NO_MCAST:+$NO_MCAST:}$MR_EXCLUDE"
    # A list made with another filter is made again, and its tests' markers (by position in
    # the list) are forgotten.
    [ -s "$list" ] && [ "$(cat "$list.filter" 2>/dev/null)" = "$filter" ] && continue
    rm -f "$WORK/state/mr-w$world-"*
    "$WORK/bin-$(first_build)/test_multidevice" --gtest_list_tests --gtest_filter="$filter" |
      awk '/^[^ ]/ { suite = $1; next } /^  [^ ]/ { print suite $1 }' >"$list"
    [ -s "$list" ] || die "no test matches MR_FILTER"
    echo "$filter" >"$list.filter"
    say "$world ranks, one GPU: $(wc -l <"$list") tests"
  done
  local t0=$(date +%s) n test port=29000 running=0
  declare -A procs=()
  for world in $MR_WORLDS; do
    mkdir -p "$res/mr/w$world"
    list="$res/mr-list-w$world.txt"
    n=0
    while IFS= read -r test; do
      n=$((n + 1))
      port=$((port + 2))
      done_ "mr-w$world-$n" && continue
      # Wait for room: no more than MR_PROCS test processes at once.
      while [ $((running + $(build_count) * world)) -gt "$MR_PROCS" ] && [ "$running" -gt 0 ]; do
        local pid
        wait -n -p pid
        running=$((running - ${procs[$pid]}))
        unset "procs[$pid]"
      done
      if [ "$(left)" -lt $((MR_TEST_TIMEOUT + 15)) ]; then
        wait # the tests under way finish (and are marked) before this call stops
        need $((MR_TEST_TIMEOUT + 15))
      fi
      mr_test "$world" "$n" "$test" "$port" </dev/null &
      procs[$!]=$(($(build_count) * world))
      running=$((running + $(build_count) * world))
    done <"$list"
  done
  wait
  say "several ranks, one GPU: W = $MR_WORLDS, $(($(date +%s) - t0)) s in this call"
  mark mr
}

