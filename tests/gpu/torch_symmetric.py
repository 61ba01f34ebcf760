"""Symmetric memory on the GPU through `nvfipc_symmetric_rendezvous`, one rank per process (run
under `mpirun -np N`, all ranks on one GPU): every rank allocates a tensor with PyTorch's
allocator as PYTORCH_CUDA_ALLOC_CONF sets it (expandable segments: VMM; default: cudaMalloc),
fills it with its rank, and maps every other rank's tensor with one rendezvous over the world,
with no barrier. Checks every peer's bytes through the mappings, times the first rendezvous
(records published, peers imported) and a second one (a cache hit), and a rendezvous of a fresh
tensor carved from the same segments. Prints one JSON line per rank.

Environment: NVFIPC_LIB, MASTER_ADDR/MASTER_PORT and the launcher's rank variables, MIB (tensor
size, default 64).
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
    out["first_us"] = rendezvous(b"weights", t)
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
    lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000))
    check(lib.nvfipc_cache_free(cache), "cache free")
    out["mismatches"] = bad
    out["ok"] = not bad
    lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000))
    lib.nvfipc_context_free(ctx)
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
