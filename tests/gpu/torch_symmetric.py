"""Symmetric memory on the GPU through `nvfipc_symmetric_rendezvous`, one rank per process (run
under `mpirun -np N`, all ranks on one GPU): every rank allocates a tensor with PyTorch's
allocator as PYTORCH_CUDA_ALLOC_CONF sets it (expandable segments: VMM; default: cudaMalloc),
fills it with its rank, and maps every other rank's tensor with one rendezvous over the world,
with no barrier. Checks every peer's bytes through the mappings, times the first rendezvous
(records published, peers imported) against its floor (the driver calls it made, timed by the
library's driver clock in the same call), a second one (a cache hit), and a rendezvous of a fresh
tensor carved from the same segments. Then the contiguous view of the first tensor
(`nvfipc_symmetric_contiguous_view`): with expandable segments, every rank writes a new value
through its own tensor and reads every member's through the view (copied to the host); with
cudaMalloc, the view must be refused as unsupported, saying a VMM allocation is needed. Last,
release and rendezvous again in a loop (`nvfipc_symmetric_release`), with the same tensor and
with fresh ones, checking the bytes each time and that the library's live VMM mappings
(`nvfipc_cuda_vmm_counters_get`) do not grow. Prints one JSON line per rank, or writes it to RESULT_DIR/rank<r>.json.

Environment: NVFIPC_LIB, MASTER_ADDR/MASTER_PORT and the launcher's rank variables, MIB (tensor
size, default 64), RESULT_DIR.
"""

import ctypes as C
import json
import os
import sys
import time

import torch

lib = C.CDLL(os.environ["NVFIPC_LIB"])
lib.nvfipc_last_error_message.restype = C.c_char_p
DEVICE = 0
STATUS_UNSUPPORTED = 8
ROUNDS = 6


class VmmCounters(C.Structure):
    _fields_ = [(name, C.c_uint64) for name in (
        "segment_exports", "segment_imports", "segment_releases", "maps", "unmaps",
        "live_segments", "live_maps", "pool_imports", "pool_frees", "inside_mapped")]


class DriverClock(C.Structure):
    _fields_ = [(f"{call}_{what}", C.c_uint64)
                for call in ("export", "fd_pass", "import", "reserve", "map", "set_access", "close")
                for what in ("ns", "calls")]


# The driver calls a rendezvous cannot do without: the floor of a first rendezvous.
FLOOR_CALLS = ("export", "fd_pass", "import", "reserve", "map", "set_access")


def live_vmm():
    c = VmmCounters()
    check(lib.nvfipc_cuda_vmm_counters_get(C.byref(c)), "vmm counters")
    return {"live_maps": c.live_maps, "live_segments": c.live_segments}


class PeerView:
    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: status {status}: "
                           f"{lib.nvfipc_last_error_message().decode(errors='replace')}")


def main():
    ctx = C.c_void_p()
    check(lib.nvfipc_context_from_env(C.byref(ctx)), "context")
    rank, world = C.c_int64(), C.c_int64()
    lib.nvfipc_context_rank(ctx, C.byref(rank))
    lib.nvfipc_context_world_size(ctx, C.byref(world))
    rank, world = rank.value, world.value
    torch.cuda.set_device(0)
    cache = C.c_void_p()
    check(lib.nvfipc_cache_create(ctx, C.byref(cache)), "cache")
    n = int(os.environ.get("MIB", "64")) << 20
    out = {"rank": rank, "world": world, "bytes": n,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    ptrs = (C.c_uint64 * world)()
    sizes = (C.c_uint64 * world)()

    def rendezvous(tag, t):
        t0 = time.perf_counter()
        check(lib.nvfipc_symmetric_rendezvous(cache, tag, DEVICE, C.c_uint64(t.data_ptr()),
                                              C.c_uint64(t.numel()), None, C.c_size_t(0),
                                              C.c_int64(60000), ptrs, sizes, C.c_size_t(world)),
              f"rendezvous {tag}")
        return (time.perf_counter() - t0) * 1e6

    def verify(value_of):
        bad = {}
        for r in range(world):
            peer = torch.as_tensor(PeerView(ptrs[r], sizes[r]), device="cuda")
            wrong = int((peer != value_of(r)).sum())
            if wrong:
                bad[r] = wrong
        return bad

    t = torch.full((n,), rank + 1, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    # Only to time the rendezvous itself, not the ranks' start-up skew: the library needs none.
    check(lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000)), "barrier")
    # The first rendezvous against its floor: the driver calls it made on these segments
    # (exports, descriptors passed, imports, reservations, maps, access), timed by the library's
    # driver clock in this very call.
    check(lib.nvfipc_cuda_driver_clock(1, None), "driver clock on")
    out["first_us"] = rendezvous(b"weights", t)
    clock = DriverClock()
    check(lib.nvfipc_cuda_driver_clock(0, C.byref(clock)), "driver clock")
    out["first_driver"] = {c: {"us": getattr(clock, f"{c}_ns") / 1e3,
                               "calls": getattr(clock, f"{c}_calls")} for c in FLOOR_CALLS}
    out["first_floor_us"] = sum(v["us"] for v in out["first_driver"].values())
    bad = verify(lambda r: r + 1)
    warm = [rendezvous(b"weights", t) for _ in range(20)]
    out["again_us_median"] = sorted(warm)[len(warm) // 2]
    # A fresh tensor from the same allocator (the caching allocator carves it from segments the
    # peers may have mapped already).
    u = torch.full((n // 4,), rank + 101, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    check(lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000)), "barrier")
    out["fresh_us"] = rendezvous(b"activations", u)
    bad.update({f"fresh-{k}": v for k, v in verify(lambda r: r + 101).items()})
    barrier = lambda: check(lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000)),
                            "barrier")
    barrier()

    vmm = "expandable_segments:True" in out["alloc_conf"]
    base, stride = C.c_uint64(), C.c_uint64()

    def view(tag, value_of, label, to_host=False):
        """The view of `tag`: every member's bytes read through it (copied to the host, or
        compared on the device)."""
        check(lib.nvfipc_symmetric_contiguous_view(cache, tag, C.byref(base), C.byref(stride)),
              f"contiguous view {tag}")
        for r in range(world):
            member = torch.as_tensor(PeerView(base.value + r * stride.value, n), device="cuda")
            wrong = int(((member.cpu() if to_host else member) != value_of(r)).sum())
            if wrong:
                bad[f"{label}-view-{r}"] = wrong

    if vmm:
        t.fill_(rank + 51)
        torch.cuda.synchronize()
        barrier()
        view(b"weights", lambda r: r + 51, "weights", to_host=True)
        first = (base.value, stride.value)
        check(lib.nvfipc_symmetric_contiguous_view(cache, b"weights", C.byref(base),
                                                   C.byref(stride)), "view again")
        if (base.value, stride.value) != first:
            bad["view-again-differs"] = 1
        out["view_stride"] = stride.value
        barrier()
    else:
        st = lib.nvfipc_symmetric_contiguous_view(cache, b"weights", C.byref(base),
                                                  C.byref(stride))
        message = lib.nvfipc_last_error_message().decode(errors="replace")
        out["view_refused"] = message
        if st != STATUS_UNSUPPORTED or "VMM allocation is needed" not in message:
            bad["cudaMalloc-view-not-refused"] = st

    # Release and rendezvous again: the same tensor, then fresh ones (all ranks allocate alike).
    check(lib.nvfipc_symmetric_release(cache, b"weights"), "release")
    released = live_vmm()
    out["live_after_release"] = released
    keep = []
    # Released mappings of replaced buffers may stay mapped for buffers carved again from the same
    # allocations (the cache's retention, bounded per peer), so the level to hold is the one after
    # the first round with a fresh tensor: from then on a release must not leave more behind.
    level = None
    for i in range(ROUNDS):
        cur = t if i % 2 == 0 else torch.empty((n,), dtype=torch.uint8, device="cuda")
        keep.append(cur)
        value = (rank * 7 + i * 13) % 251
        cur.fill_(value)
        torch.cuda.synchronize()
        barrier()
        rendezvous(b"weights", cur)
        bad.update({f"round{i}-{k}": v
                    for k, v in verify(lambda r: (r * 7 + i * 13) % 251).items()})
        if vmm:
            view(b"weights", lambda r: (r * 7 + i * 13) % 251, f"round{i}")
        barrier()
        check(lib.nvfipc_symmetric_release(cache, b"weights"), f"release {i}")
        now = live_vmm()
        if i == 1:
            level = now
            out["live_after_fresh_release"] = now
        elif level is not None and (now["live_maps"] > level["live_maps"] or
                                    now["live_segments"] > level["live_segments"]):
            bad[f"round{i}-vmm-growth"] = now
    st = lib.nvfipc_symmetric_release(cache, b"weights")
    if st == 0:
        bad["second-release-accepted"] = 1
    barrier()
    check(lib.nvfipc_cache_free(cache), "cache free")
    out["mismatches"] = bad
    out["ok"] = not bad
    lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000))
    lib.nvfipc_context_free(ctx)
    line = json.dumps(out)
    # One file per rank where asked: the launcher may merge the ranks' stdout lines.
    result_dir = os.environ.get("RESULT_DIR")
    if result_dir:
        with open(os.path.join(result_dir, f"rank{out['rank']}.json"), "w") as f:
            f.write(line + "\n")
    else:
        print(line, flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
