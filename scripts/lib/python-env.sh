#!/usr/bin/env bash
# Creates (when missing) a cached Python virtual environment with PyTorch for the TCPStore
# interop tests, and prints the path of its python on stdout (everything else goes to stderr):
#
#   NVFIPC_PYTHON=$(bash scripts/lib/python-env.sh) NVFIPC_REQUIRE_TORCH=1 cargo test --test store_interop
#
# Location: ${NVFIPC_VENV:-$HOME/.cache/nvfuser-ipc/venv}. Idempotent: when the venv already
# imports torch.distributed.TCPStore it only prints the path (a few seconds for the import).
#
# What is installed, and why:
# - torch==2.11.0, the version on the GPU machines, from PyPI, with --no-deps.
# - torch's pure-Python requirements (typing-extensions, filelock, fsspec, jinja2, networkx,
#   sympy, setuptools<82).
# - The NVIDIA CUDA 13 library wheels that libtorch_cuda.so links against (cuBLAS, cudart,
#   cuFFT, cuFile, CUPTI, cuRAND, cuSOLVER, cuSPARSE, nvJitLink, NVRTC, NVTX, cuDNN, cuSPARSELt,
#   NCCL, NVSHMEM), at the exact versions torch 2.11.0 requires. PyPI only has CUDA builds of
#   torch for Linux x86_64, and `import torch` loads libtorch_cuda.so, which fails unless these
#   are present even on a machine without a GPU (checked: with torch alone, import fails on
#   libcublasLt). No GPU is needed to use them.
# - Left out: triton (only for torch.compile), cuda-bindings (Python CUDA bindings, not imported
#   by `import torch`) and the rest of the cuda-toolkit meta package.
# Result: about 4.0 GB on disk (torch 1.2 GB + CUDA libraries 2.7 GB; about 3.3 GB downloaded),
# created in 2 to 6 minutes on a 2-core machine. A plain `pip install torch==2.11.*` would also
# pull triton and cuda-bindings.
set -euo pipefail

VENV="${NVFIPC_VENV:-$HOME/.cache/nvfuser-ipc/venv}"
PY="$VENV/bin/python"
CHECK='import torch, torch.distributed as dist; assert dist.is_available(); dist.TCPStore'

log() { echo "python-env: $*" >&2; }

works() {
    [ -x "$PY" ] && "$PY" -W ignore -c "$CHECK" >/dev/null 2>&1
}

if works; then
    echo "$PY"
    exit 0
fi

mkdir -p "$(dirname "$VENV")"
# Serialize concurrent creators (several test runs may start at once).
exec 9>"$VENV.lock"
flock 9
if works; then
    echo "$PY"
    exit 0
fi

BASE_PY=""
for candidate in python3.11 python3.12 python3.10 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then
        BASE_PY="$(command -v "$candidate")"
        break
    fi
done
if [ -z "$BASE_PY" ]; then
    log "no python3 found on PATH; install Python 3.10-3.12"
    exit 1
fi

log "creating $VENV with $BASE_PY (downloads about 3 GB)"
rm -rf "$VENV"
"$BASE_PY" -m venv "$VENV"
PIP=("$PY" -m pip install --disable-pip-version-check --no-input --quiet)
# Pure-Python requirements first, then the CUDA libraries, then torch itself.
"${PIP[@]}" "typing-extensions>=4.10.0" filelock "fsspec>=0.8.5" jinja2 "networkx>=2.5.1" \
    "sympy>=1.13.3" "setuptools<82"
"${PIP[@]}" --no-deps \
    "nvidia-cublas==13.1.0.3.*" "nvidia-cuda-runtime==13.0.96.*" "nvidia-cufft==12.0.0.61.*" \
    "nvidia-cufile==1.15.1.6.*" "nvidia-cuda-cupti==13.0.85.*" "nvidia-curand==10.4.0.35.*" \
    "nvidia-cusolver==12.0.4.66.*" "nvidia-cusparse==12.6.3.3.*" "nvidia-nvjitlink==13.0.88.*" \
    "nvidia-cuda-nvrtc==13.0.88.*" "nvidia-nvtx==13.0.85.*" \
    "nvidia-cudnn-cu13==9.19.0.56" "nvidia-cusparselt-cu13==0.8.0" "nvidia-nccl-cu13==2.28.9" \
    "nvidia-nvshmem-cu13==3.4.5"
# Last, so that pip's resolver does not warn about the requirements deliberately left out.
"${PIP[@]}" --no-deps "torch==2.11.0"

if ! "$PY" -W ignore -c "$CHECK" >&2; then
    log "torch was installed in $VENV but does not import; see the error above"
    exit 1
fi
log "ready: $("$PY" -W ignore -c 'import torch; print(torch.__version__)' 2>/dev/null)"
echo "$PY"
