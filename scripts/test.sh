#!/usr/bin/env bash
# Runs every test of the project on a machine with no GPU: Rust unit and multi-process tests (of
# the library, the nvfipc-store crate and the CLI: the workspace's default members) and the store
# crate's documentation example, interop with real PyTorch (the pinned torch and the newest on the
# package index), the C/C++ GoogleTest suites, the Python wheel and API, and a bounded fuzz run of
# the store's frame parser. Installs what it needs (Debian packages, two cached Python venvs with torch, one with
# maturin). Each step prints `[k/N] name`, then its duration; a table of every step ends the run.
# Long, noisy output (the fuzzer's, the installers') goes to a log file under build/test-logs
# whose path is printed, and is shown only when its step fails; tests capture the warnings they
# provoke on purpose, so that the ERROR and WARN lines left on the console are not expected ones.
set -euo pipefail
cd "$(dirname "$0")/.."

logs="$PWD/build/test-logs"
mkdir -p "$logs"

steps=(
    "dependencies (apt packages, Python venvs)"
    "fuzz the store frame parser"
    "cargo test (release)"
    "nvfipc-store's documentation example"
    "store server suite with three event loops"
    "PyTorch interop with the newest torch"
    "C/C++ suites (CMake + GoogleTest)"
    "pkg-config file and a C program built with it"
    "Python wheel, C++ consumer and Python API"
    "README's C example, install and pkg-config as printed"
)
total=${#steps[@]}
names=()
times=()
results=()
k=0
suite_start=$SECONDS

summary() {
    local rc=$?
    echo
    echo "== summary ($((SECONDS - suite_start)) s in all)"
    printf '%-4s %-48s %8s  %s\n' "step" "name" "seconds" "result"
    local i
    for i in "${!names[@]}"; do
        printf '%-4s %-48s %8s  %s\n' "$((i + 1))/$total" "${names[$i]}" "${times[$i]}" "${results[$i]}"
    done
    if [ "$rc" -ne 0 ]; then
        echo "FAILED at step $k/$total (${steps[$((k - 1))]}); see its output above"
    fi
}
trap summary EXIT

# step FUNCTION: runs the next step of `steps`, timing it.
step() {
    k=$((k + 1))
    local name="${steps[$((k - 1))]}" start=$SECONDS
    names+=("$name")
    times+=("-")
    results+=("failed")
    echo
    echo "[$k/$total] $name"
    "$@"
    times[$((k - 1))]=$((SECONDS - start))
    results[$((k - 1))]="ok"
    echo "[$k/$total] $name: ok in $((SECONDS - start)) s"
}

# quietly LOG COMMAND...: runs COMMAND with its stderr (an installer's progress, pip's and apt's
# notices) going to $logs/LOG, shown only when COMMAND fails; its stdout is this function's.
quietly() {
    local log="$logs/$1"
    shift
    echo "$* (its output: $log)" >&2
    if ! "$@" 2>"$log"; then
        cat "$log" >&2
        echo "'$*' failed; its output is above and in $log" >&2
        return 1
    fi
}

dependencies() {
    quietly deps.log bash scripts/lib/deps.sh
    # The first run installs torch (minutes), later ones find it.
    NVFIPC_PYTHON="$(quietly python-env.log bash scripts/lib/python-env.sh)"
    export NVFIPC_PYTHON NVFIPC_REQUIRE_TORCH=1
    echo "PyTorch: $NVFIPC_PYTHON"
}

fuzz() {
    local log="$logs/fuzz.log"
    echo "fuzzer output: $log"
    if ! bash scripts/checks/fuzz.sh "${NVFIPC_FUZZ_SECONDS:-60}" >"$log" 2>&1; then
        tail -40 "$log"
        echo "the fuzz run failed; its whole output is in $log" >&2
        return 1
    fi
    # libFuzzer's last status line: runs, coverage, corpus.
    grep -E '^#[0-9]+' "$log" | tail -1 || true
}

interop_newest() {
    local python
    python="$(quietly python-env-newest.log bash scripts/lib/python-env-newest.sh)"
    echo "newest PyTorch: $python"
    NVFIPC_PYTHON="$python" cargo test --release --test store_interop
}

step dependencies
step fuzz
step cargo test --release --all-targets
step cargo test --release --doc -p nvfipc-store
step env NVFIPC_TEST_STORE_THREADS=3 cargo test --release --test store_server
step interop_newest
step bash scripts/checks/cpp-tests.sh build/ci-cpp
step bash scripts/checks/pkgconfig-check.sh
step bash scripts/checks/wheel-check.sh build/wheel/check
step bash scripts/checks/readme-check.sh
