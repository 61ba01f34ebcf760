#!/usr/bin/env bash
# Creates (when missing) a second cached Python virtual environment with the newest torch the
# package index serves, for running the TCPStore interop tests against the newest torch clients
# and servers as well as the pinned one (scripts/lib/python-env.sh). Prints the path of its python on
# stdout (everything else goes to stderr):
#
#   NVFIPC_PYTHON=$(bash scripts/lib/python-env-newest.sh) cargo test --test store_interop
#
# Location: ${NVFIPC_VENV_NEWEST:-$HOME/.cache/nvfuser-ipc/venv-newest}. NVFIPC_TORCH_NEWEST
# pins a version (e.g. 2.15.0); without it the newest release on the index is used, and a venv
# holding an older torch is rebuilt once the index serves a newer one (checked once a day; the
# check is one `pip index versions torch`, and a failed check keeps the venv as it is).
#
# What is installed: torch with --no-deps, then the requirements torch itself declares for this
# platform (its pure-Python ones and the NVIDIA CUDA library wheels that `import torch` loads even
# without a GPU), read from the installed torch's metadata, without triton (only for
# torch.compile) and cuda-bindings (Python CUDA bindings, never imported by `import torch`).
set -euo pipefail

VENV="${NVFIPC_VENV_NEWEST:-$HOME/.cache/nvfuser-ipc/venv-newest}"
PY="$VENV/bin/python"
CHECK='import torch, torch.distributed as dist; assert dist.is_available(); dist.TCPStore'
STAMP="$VENV/.nvfipc-index-checked"

log() { echo "python-env-newest: $*" >&2; }

works() {
    [ -x "$PY" ] && "$PY" -W ignore -c "$CHECK" >/dev/null 2>&1
}

installed_version() {
    "$PY" -W ignore -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null
}

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

# The version wanted: the pin, or the newest on the index (empty when the index cannot be asked).
wanted() {
    if [ -n "${NVFIPC_TORCH_NEWEST:-}" ]; then
        echo "$NVFIPC_TORCH_NEWEST"
        return
    fi
    "$BASE_PY" -m pip index versions torch --disable-pip-version-check 2>/dev/null |
        sed -n 's/^torch (\([^)]*\)).*/\1/p' | head -n 1
}

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock 9

if works; then
    have="$(installed_version)"
    if [ -n "${NVFIPC_TORCH_NEWEST:-}" ]; then
        if [ "$have" = "$NVFIPC_TORCH_NEWEST" ]; then
            echo "$PY"
            exit 0
        fi
    elif [ -n "$(find "$STAMP" -mmin -1440 2>/dev/null)" ]; then
        echo "$PY"
        exit 0
    else
        want="$(wanted)"
        if [ -z "$want" ] || [ "$want" = "$have" ]; then
            touch "$STAMP"
            echo "$PY"
            exit 0
        fi
        log "the index serves torch $want, the venv has $have: rebuilding"
    fi
fi

want="$(wanted)"
# Without an answer from `pip index`, pip's own resolution picks the newest release.
spec="torch${want:+==$want}"
log "creating $VENV with $spec and $BASE_PY (downloads about 4 GB)"
rm -rf "$VENV"
"$BASE_PY" -m venv "$VENV"
PIP=("$PY" -m pip install --disable-pip-version-check --no-input --quiet)
"${PIP[@]}" --no-deps "$spec"
# torch's own requirements for this platform, minus the two it never needs to import.
mapfile -t REQS < <("$PY" - <<'EOF'
from importlib.metadata import requires
try:
    from packaging.requirements import Requirement
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
for text in requires("torch") or []:
    req = Requirement(text)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name in ("triton", "cuda-bindings"):
        continue
    req.marker = None
    print(str(req))
EOF
)
log "torch $want requires: ${REQS[*]}"
# Without triton and cuda-bindings, which torch lists: pip would call that a conflict (an ERROR
# line) although it is what this script means to install.
"${PIP[@]}" --no-warn-conflicts "${REQS[@]}"

if ! "$PY" -W ignore -c "$CHECK" >&2; then
    log "torch was installed in $VENV but does not import; see the error above"
    exit 1
fi
touch "$STAMP"
log "ready: $(installed_version)"
echo "$PY"
