#!/usr/bin/env bash
# Runs the TCPStore frame-parser fuzz target for a bounded time.
# Usage: scripts/checks/fuzz.sh [seconds]   (default 30)
# cargo-fuzz needs nightly features; RUSTC_BOOTSTRAP=1 unlocks them on the stable toolchain.
set -euo pipefail

seconds="${1:-30}"
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
    echo "usage: $0 [seconds]  (a positive whole number, default 30)" >&2
    exit 2
fi

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz >&2
fi

cd "$root/fuzz"
export RUSTC_BOOTSTRAP=1
# -max_total_time bounds the fuzzing itself; the outer timeout also bounds the build.
timeout --signal=INT --kill-after=30 "$((seconds + 900))" \
    cargo fuzz run frame_parser -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048
