#!/usr/bin/env bash
# Runs every test of the project on a machine with no GPU: Rust unit and multi-process tests,
# interop with real PyTorch (the pinned torch and the newest on the package index), the C/C++
# GoogleTest suites, the Python wheel and API, and a bounded fuzz run of the store's frame
# parser. Installs what it needs (Debian packages, two cached Python venvs with torch, one with
# maturin).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/lib/deps.sh

NVFIPC_PYTHON="$(bash scripts/lib/python-env.sh)"
export NVFIPC_PYTHON NVFIPC_REQUIRE_TORCH=1

echo "== fuzz the store frame parser (bounded, first: its output is long)"
bash scripts/checks/fuzz.sh "${NVFIPC_FUZZ_SECONDS:-60}"

echo "== cargo test (release profile for realistic multi-process timing)"
cargo test --release --all-targets
echo "== store server suite again, with three event loops"
NVFIPC_TEST_STORE_THREADS=3 cargo test --release --test store_server
echo "== PyTorch interop again, with the newest torch on the package index"
NVFIPC_PYTHON="$(bash scripts/lib/python-env-newest.sh)" cargo test --release --test store_interop

echo "== C/C++ suites (CMake + GoogleTest)"
bash scripts/checks/cpp-tests.sh build/ci-cpp


echo "== pkg-config file: installed, then a C program built with it alone"
bash scripts/checks/pkgconfig-check.sh

echo "== Python wheel: built from target/release, installed in a fresh venv, C++ consumer and Python API"
bash scripts/checks/wheel-check.sh build/wheel/check

echo "== README's C example, compiled and run as printed"
bash scripts/checks/readme-check.sh
