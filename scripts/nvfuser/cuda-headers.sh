#!/usr/bin/env bash
# Prints a directory of the CUDA headers that torch's pip wheels leave out but nvFuser's sources
# include (crt/host_config.h, CCCL's <nv/target>, cuda_profiler_api.h), for compiling nvFuser files
# on a machine without a CUDA toolkit (scripts/nvfuser/dropin-check.sh). They come from NVIDIA's
# header wheels at the version of the installed nvidia-cuda-runtime wheel, unpacked once into
# ${NVFIPC_CUDA_HEADERS:-$HOME/.cache/nvfuser-ipc/cuda-headers-<version>}.
#
# Usage: scripts/nvfuser/cuda-headers.sh PYTHON     (the python whose environment holds torch's wheels)
set -euo pipefail
python="${1:?usage: $0 PYTHON}"
version="$("$python" -c 'import importlib.metadata as m; print(m.version("nvidia-cuda-runtime"))' 2>/dev/null ||
  "$python" -c 'import importlib.metadata as m; print(m.version("nvidia-cuda-runtime-cu12"))')"
series="$(echo "$version" | cut -d. -f1-2)"
dir="${NVFIPC_CUDA_HEADERS:-$HOME/.cache/nvfuser-ipc/cuda-headers-$series}"
if [ ! -f "$dir/.complete" ]; then
  rm -rf "$dir" && mkdir -p "$dir/wheels"
  for pkg in nvidia-cuda-crt nvidia-cuda-cccl nvidia-cuda-profiler-api; do
    "$python" -m pip download --no-deps -q -d "$dir/wheels" "$pkg==$series.*" >&2
  done
  for whl in "$dir"/wheels/*.whl; do
    "$python" -m zipfile -e "$whl" "$dir/unpacked" >&2
  done
  touch "$dir/.complete"
fi
inc="$(dirname "$(find "$dir/unpacked" -path '*/include/crt/host_config.h' -print -quit)")"
[ -d "$inc" ] || { echo "cuda-headers: no include dir under $dir" >&2; exit 1; }
echo "$(cd "$inc/.." && pwd)"
