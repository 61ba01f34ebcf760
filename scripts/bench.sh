#!/usr/bin/env bash
# Runs the full benchmark (the tables of docs/BENCHMARKS.md) on this machine and writes the results:
#
#   bash scripts/bench.sh [OUT_DIR]          # default OUT_DIR: docs/bench
#
# OUT_DIR gets bench.json, exchange.svg, store.svg and barrier.svg; the tables go to stdout
# and to OUT_DIR/bench.txt. PyTorch's TCPStore servers come from the cached venv of
# scripts/lib/python-env.sh (created on first use); when that fails, the torch rows are skipped
# with a note. Extra arguments after OUT_DIR go to `nvfipc bench` (e.g. --transport host).
#
# On a machine without cargo (a GPU machine), run a binary built elsewhere directly:
#   NVFIPC_PYTHON=$(command -v python3) ./nvfipc bench --json out/bench.json --svg-dir out
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${1:-docs/bench}"
shift || true
mkdir -p "$OUT"

if [ -z "${NVFIPC_PYTHON:-}" ]; then
    if NVFIPC_PYTHON="$(bash scripts/lib/python-env.sh)"; then
        export NVFIPC_PYTHON
    else
        echo "bench.sh: no Python with torch; the torch store rows will be skipped" >&2
        unset NVFIPC_PYTHON
    fi
fi

if command -v cargo >/dev/null 2>&1; then
    cargo build --release --bin nvfipc
fi
NVFIPC="${NVFIPC:-target/release/nvfipc}"

"$NVFIPC" bench --json "$OUT/bench.json" --svg-dir "$OUT" "$@" | tee "$OUT/bench.txt"
