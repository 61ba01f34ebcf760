#!/usr/bin/env bash
# The Python API on a GPU machine: tests/gpu/python_api.py under `mpirun -np 2` and `-np 4`,
# with PyTorch's default allocator and with expandable segments (VMM). Needs torch and mpirun;
# uses the prebuilt target/release/libnvfuser_ipc.so (NVFIPC_LIBRARY overrides it) and the
# package from python/ (no wheel needed). Ends with a PASS/FAIL summary; exits 1 on a failure.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export NVFIPC_LIBRARY="${NVFIPC_LIBRARY:-$PWD/target/release/libnvfuser_ipc.so}"
py="${NVFIPC_PYTHON:-python3}"
failed=0
summary=()
for conf in "" "expandable_segments:True"; do
  for np in 2 4; do
    name="np $np, ${conf:-default allocator}"
    echo "== $name"
    if PYTORCH_CUDA_ALLOC_CONF="$conf" timeout 300 mpirun -np "$np" --allow-run-as-root \
         -x PYTHONPATH -x NVFIPC_LIBRARY -x PYTORCH_CUDA_ALLOC_CONF \
         "$py" tests/gpu/python_api.py; then
      summary+=("PASS $name")
    else
      summary+=("FAIL $name"); failed=1
    fi
  done
done
printf '%s\n' "${summary[@]}"
exit "$failed"
