#!/usr/bin/env bash
# Symmetric memory on the GPU machine (one GPU, several ranks; no cargo there), run from the
# repository root with the library built elsewhere: tests/gpu/torch_symmetric.py under mpirun at
# each rank count, with PyTorch's expandable segments (VMM) and its default allocator
# (cudaMalloc). Each run also checks the contiguous view (read through it with expandable
# segments, refused as unsupported with cudaMalloc) and release + rendezvous again in a loop
# without growth of the live VMM mappings. One JSON file per rank under $OUT/<run>/ (mpirun may
# merge the ranks' stdout lines), and a table of the
# rendezvous cost (median over ranks of the first rendezvous and of its floor, the driver calls it
# made as the library's driver clock timed them; of a second one, and of a fresh tensor) per run.
# Environment: OUT (default ./gpu-out/symmetric), NVFIPC_LIB (default
# target/release/libnvfuser_ipc.so), RANKS (default "2 4 8"), MIB (tensor size, default 64).
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
OUT="${OUT:-$root/gpu-out/symmetric}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
lib="$(realpath "${NVFIPC_LIB:-$root/target/release/libnvfuser_ipc.so}")"
fail=0
port=29950
for conf in "expandable_segments:True=vmm" "=legacy"; do
  alloc="${conf%=*}"
  label="${conf##*=}"
  for np in ${RANKS:-2 4 8}; do
    port=$((port + 1))
    name="symmetric-np$np-$label"
    rm -rf "${OUT:?}/$name" && mkdir -p "$OUT/$name"
    timeout -k 5 180 mpirun -np "$np" --oversubscribe -x PYTORCH_CUDA_ALLOC_CONF="$alloc" \
      -x NVFIPC_LIB="$lib" -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" -x MIB="${MIB:-64}" \
      -x RESULT_DIR="$OUT/$name" \
      python3 tests/gpu/torch_symmetric.py >"$OUT/$name.out" 2>"$OUT/$name.err"
    rc=$?
    python3 - "$OUT/$name" "$name" "$np" "$rc" <<'PY' || fail=1
import glob, json, os, statistics, sys
path, name, np, rc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
rows = [json.load(open(f)) for f in sorted(glob.glob(os.path.join(path, "rank*.json")))]
ok = rc == 0 and len(rows) == np and all(r["ok"] for r in rows)
med = lambda k: statistics.median(r[k] for r in rows) if rows else float("nan")
floor = med('first_floor_us') if rows and all('first_floor_us' in r for r in rows) else 0
vs_floor = f" (floor {floor:.0f} us, {med('first_us') / floor:.2f}x)" if floor else ""
print(f"{name}: {'ok' if ok else 'FAILED'} rc={rc} ranks={len(rows)}/{np} first {med('first_us'):.0f} us{vs_floor}, "
      f"again {med('again_us_median'):.1f} us, fresh {med('fresh_us'):.0f} us, "
      f"view stride {rows[0].get('view_stride', 'refused') if rows else '-'}")
for r in rows:
    if not r["ok"]:
        print(f"  rank {r['rank']}: {r['mismatches']}")
sys.exit(0 if ok else 1)
PY
    [ "$rc" -eq 0 ] || tail -n 5 "$OUT/$name.err"
  done
done
[ "$fail" -eq 0 ] && echo "gpu-symmetric-check: PASSED" || echo "gpu-symmetric-check: FAILED"
exit "$fail"
