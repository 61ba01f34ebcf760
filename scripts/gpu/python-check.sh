#!/usr/bin/env bash
# The Python API on a GPU machine: tests/gpu/python_api.py under `mpirun -np 2` and `-np 4`,
# with PyTorch's default allocator and with expandable segments (VMM); the README's CUDA example
# (examples/python/cuda_exchange.py under `nvfipc launch -n 2`, as printed there); and
# tests/python/api_misuse.py with torch's CUDA tensors. Needs torch and mpirun; uses the prebuilt
# target/release/libnvfuser_ipc.so and target/release/nvfipc (NVFIPC_LIBRARY and NVFIPC_BIN
# override them) and the package from python/ (no wheel needed). Ends with a PASS/FAIL summary;
# exits 1 on a failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export NVFIPC_LIBRARY="${NVFIPC_LIBRARY:-$PWD/target/release/libnvfuser_ipc.so}"
py="${NVFIPC_PYTHON:-python3}"
nvfipc="${NVFIPC_BIN:-$PWD/target/release/nvfipc}"
failed=0
summary=()

check() { # NAME CMD...: runs CMD (at most 300 s) and records NAME as passed or failed
  local name="$1"
  shift
  echo "== $name"
  if timeout 300 "$@"; then summary+=("PASS $name"); else summary+=("FAIL $name"); failed=1; fi
}

check "examples/python/cuda_exchange.py, nvfipc launch -n 2" \
  "$nvfipc" launch -n 2 -- "$py" examples/python/cuda_exchange.py
check "tests/python/api_misuse.py with CUDA tensors" "$py" tests/python/api_misuse.py --require-torch
for conf in "" "expandable_segments:True"; do
  for np in 2 4; do
    check "np $np, ${conf:-default allocator}" env PYTORCH_CUDA_ALLOC_CONF="$conf" \
      mpirun -np "$np" --allow-run-as-root -x PYTHONPATH -x NVFIPC_LIBRARY \
      -x PYTORCH_CUDA_ALLOC_CONF "$py" tests/gpu/python_api.py
  done
done
printf '%s\n' "${summary[@]}"
exit "$failed"
