"""Real PyTorch tensors through the handle cache, one rank per process (run under `mpirun -np N`,
all ranks on the visible GPUs): every rank allocates tensors with PyTorch's allocator as
configured by PYTORCH_CUDA_ALLOC_CONF (set per run by scripts/gpu/vmm-check.sh), exchanges them
on a ring through the library's C API (ctypes), and checks byte for byte that the previous
rank's tensors read back through the mappings. Tensors include ones larger than one expandable
segment (20 MiB), small ones carved from imported segments, and a cudaMalloc'd buffer in the same
batch. Prints one JSON line per rank with the outcome, timings and counters.

With PyTorch's cudaMallocAsync backend the device's default pool is not IPC-capable: the script
then checks that the exchange refuses the tensors with a message naming the setting.

Environment: NVFIPC_LIB (path of libnvfuser_ipc.so), MASTER_ADDR/MASTER_PORT and the launcher's
rank variables (OMPI_COMM_WORLD_*), EXPECT ("vmm", "legacy" or "refused").
"""

import ctypes as C
import json
import os
import sys
import time

import torch

lib = C.CDLL(os.environ["NVFIPC_LIB"])


class Request(C.Structure):
    _fields_ = [("peer", C.c_int64), ("direction", C.c_int32), ("kind", C.c_int32),
                ("tag", C.c_char_p), ("ptr", C.c_uint64), ("bytes", C.c_uint64)]


class Handle(C.Structure):
    _fields_ = [("local_ptr", C.c_uint64), ("local_bytes", C.c_uint64),
                ("local_semaphore", C.c_uint64), ("peer_ptr", C.c_uint64),
                ("peer_bytes", C.c_uint64), ("peer_semaphore", C.c_uint64),
                ("kind", C.c_int32)]


class VmmCounters(C.Structure):
    _fields_ = [(n, C.c_uint64) for n in (
        "segment_exports", "segment_imports", "segment_releases", "maps", "unmaps",
        "live_segments", "live_maps", "pool_imports", "pool_frees")]


lib.nvfipc_last_error_message.restype = C.c_char_p
SEND, RECV, DEVICE = 0, 1, 0
MEMORY = {0: "legacy", 1: "vmm", 2: "pool"}


def check(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: status {status}: "
                           f"{lib.nvfipc_last_error_message().decode(errors='replace')}")


class PeerView:
    """A tensor over a peer pointer (the CUDA array interface; nothing is copied)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def pattern(rank, which, n):
    g = torch.Generator().manual_seed(1000 * rank + which)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def counters():
    c = VmmCounters()
    check(lib.nvfipc_cuda_vmm_counters_get(C.byref(c)), "vmm counters")
    return {n: getattr(c, n) for n, _ in VmmCounters._fields_}


def main():
    expect = os.environ.get("EXPECT", "vmm")
    ctx = C.c_void_p()
    check(lib.nvfipc_context_from_env(C.byref(ctx)), "context")
    rank, world = C.c_int64(), C.c_int64()
    lib.nvfipc_context_rank(ctx, C.byref(rank))
    lib.nvfipc_context_world_size(ctx, C.byref(world))
    rank, world = rank.value, world.value
    torch.cuda.set_device(0)
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    cache = C.c_void_p()
    check(lib.nvfipc_cache_create(ctx, C.byref(cache)), "cache")

    mib = 1 << 20
    # Sizes: inside one 2 MiB / 20 MiB segment, and larger than one 20 MiB segment.
    sizes = {"small": 64 * 1024, "medium": 3 * mib, "large": 45 * mib, "huge": 70 * mib}
    tensors = {}
    for i, (name, n) in enumerate(sizes.items()):
        tensors[name] = pattern(rank, i, n).cuda()
    legacy = C.c_uint64(0)
    cuda = C.CDLL("libcuda.so.1")
    extra = {}
    if expect != "refused":
        # A cuMemAlloc'd buffer beside PyTorch's (legacy IPC in the same batch), in the primary
        # context PyTorch made current.
        check(cuda.cuMemAlloc_v2(C.byref(legacy), C.c_size_t(mib)), "cuMemAlloc")
        data = pattern(rank, 9, mib)
        view = torch.as_tensor(PeerView(legacy.value, mib), device="cuda")
        view.copy_(data.cuda())
        extra["cudamalloc"] = (legacy.value, mib, 9)
    torch.cuda.synchronize()

    items = [(name, t.data_ptr(), t.numel(), i) for i, (name, t) in enumerate(tensors.items())]
    items += [(name, p, n, w) for name, (p, n, w) in extra.items()]
    kinds = {}
    for name, ptr, n, _ in items:
        k = C.c_int32(-1)
        check(lib.nvfipc_cuda_pointer_memory(C.c_void_p(ptr), C.c_uint64(n), C.byref(k)),
              f"pointer memory of {name}")
        kinds[name] = MEMORY.get(k.value, str(k.value))
    tags = [C.c_char_p(name.encode()) for name, *_ in items]
    reqs = (Request * (2 * len(items)))()
    for j, (name, ptr, n, _) in enumerate(items):
        reqs[2 * j] = Request(nxt, SEND, DEVICE, tags[j], ptr, n)
        reqs[2 * j + 1] = Request(prev, RECV, DEVICE, tags[j], ptr, n)

    out = {"rank": rank, "world": world, "expect": expect, "kinds": kinds,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    before = counters()
    t0 = time.perf_counter()
    status = lib.nvfipc_exchange_handles_timeout(cache, reqs, C.c_size_t(len(reqs)),
                                                 C.c_int64(60000))
    out["cold_us"] = (time.perf_counter() - t0) * 1e6
    if expect == "refused":
        msg = lib.nvfipc_last_error_message().decode(errors="replace")
        out["status"], out["message"] = status, msg
        ok = status != 0 and "cudaMallocAsync" in msg
        out["ok"] = ok
        print(json.dumps(out), flush=True)
        lib.nvfipc_cache_free(cache)
        lib.nvfipc_context_free(ctx)
        return 0 if ok else 1
    check(status, "exchange")
    bad = {}
    for j, (name, ptr, n, which) in enumerate(items):
        h = Handle()
        check(lib.nvfipc_cache_get(cache, C.byref(reqs[2 * j + 1]), C.byref(h)), f"get {name}")
        peer = torch.as_tensor(PeerView(h.peer_ptr, n), device="cuda").cpu()
        diff = int((peer != pattern(prev, which, n)).sum())
        if diff:
            bad[name] = diff
    cold = counters()
    out["cold_counters"] = {k: cold[k] - before[k] for k in cold}

    # Warm: the same tensors again (cache hits).
    t0 = time.perf_counter()
    for _ in range(100):
        check(lib.nvfipc_exchange_handles(cache, reqs, C.c_size_t(len(reqs))), "warm exchange")
    out["warm_us"] = (time.perf_counter() - t0) * 1e6 / 100

    # New tensors carved from the caching allocator's imported segments: free the small ones,
    # allocate others of the same sizes, exchange again.
    del tensors["small"]
    fresh = pattern(rank, 20, 96 * 1024).cuda()
    torch.cuda.synchronize()
    tag = C.c_char_p(b"fresh")
    r2 = (Request * 2)(Request(nxt, SEND, DEVICE, tag, fresh.data_ptr(), fresh.numel()),
                       Request(prev, RECV, DEVICE, tag, fresh.data_ptr(), fresh.numel()))
    lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000))
    mid = counters()
    t0 = time.perf_counter()
    check(lib.nvfipc_exchange_handles(cache, r2, C.c_size_t(2)), "fresh exchange")
    out["fresh_us"] = (time.perf_counter() - t0) * 1e6
    h = Handle()
    check(lib.nvfipc_cache_get(cache, C.byref(r2[1]), C.byref(h)), "get fresh")
    peer = torch.as_tensor(PeerView(h.peer_ptr, fresh.numel()), device="cuda").cpu()
    diff = int((peer != pattern(prev, 20, fresh.numel())).sum())
    if diff:
        bad["fresh"] = diff
    after_fresh = counters()
    out["fresh_counters"] = {k: after_fresh[k] - mid[k] for k in mid}

    torch.cuda.synchronize()
    lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000))
    check(lib.nvfipc_cache_free(cache), "cache free")
    check(lib.nvfipc_cuda_ipc_flush_releases(C.c_int64(60000)), "flush")
    end = counters()
    ipc = (C.c_uint64 * 5)()
    lib.nvfipc_cuda_ipc_counters_get(ipc)
    out["end_counters"] = end
    out["ipc"] = {"opens": ipc[0], "closes": ipc[1], "live": ipc[2]}
    out["mismatches"] = bad
    balanced = (end["segment_imports"] == end["segment_releases"] and end["maps"] == end["unmaps"]
                and end["live_segments"] == 0 and ipc[0] == ipc[1])
    want_kind = "vmm" if expect == "vmm" else "legacy"
    kinds_ok = all(kinds[n] == want_kind for n in sizes) and \
        all(kinds[n] == "legacy" for n in extra)
    out["ok"] = not bad and balanced and kinds_ok
    lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(60000))
    if legacy.value:
        cuda.cuMemFree_v2(legacy)
    lib.nvfipc_context_free(ctx)
    print(json.dumps(out), flush=True)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
