"""Real PyTorch allocator lifecycles through the handle cache, one rank per process (run under
`mpirun -np N`, all ranks on one GPU): what a training loop does to the cache, drawn at random from
a seed and checked after every step.

Every step each rank allocates a fresh tensor (PyTorch's allocator as PYTORCH_CUDA_ALLOC_CONF sets
it: expandable segments or the default), sometimes a view at an offset inside a larger one, fills
it with a value known to every rank, and exchanges it on a ring under a tag drawn from a few reused
ones (sometimes twice in one batch, in different orders on the two sides). It then reads the
previous rank's tensor through the mapping and writes into the next rank's receive buffer through
its mapping, and checks what it received. Tensors are freed a few steps later (so addresses come
back), now and then all are dropped and `torch.cuda.empty_cache()` returns the segments to the
driver, and at agreed steps every rank frees its cache and creates a new one. After the run every
import was released and every mapping unmapped.

MODE=churn runs the program of the known failure: each rank one tensor per step of a size it
draws from {4 KiB, 1 MiB, 3 MiB, 24 MiB, 70 MiB, 333,333 B}, sent to the next rank and received
from the previous one under one of three tags in turn (the peer's tensor read through the
mapping, no writes), the last two steps' tensors kept, and (unless EMPTY=0) every fifth step all
dropped and `empty_cache()` called. MODE=random draws everything from SEED.

ALLOC=vmm takes every tensor's memory from an allocator of this script instead of PyTorch's: one
reserved range, 2 MiB physical chunks created with POSIX-fd handles and mapped as allocations
need them, unmapped and released by its empty_cache() when no allocation uses them, so that new
chunks come back at old addresses (what expandable segments do, under the test's control).

ALLOC=pool takes it from a stream-ordered pool created with POSIX-fd handles (IPC-capable). CUDA
requires importers to free a pool allocation before its exporter does, so this mode frees pool
memory only right after the cache was freed (its teardown waits until every peer has released
what it imported), and caches are re-created at random steps; `empty_cache` trims the pool.

Environment: NVFIPC_LIB, MASTER_ADDR/MASTER_PORT and the launcher's rank variables, MODE
(churn|random), ALLOC (torch|vmm|pool), STEPS (default 200), SEED (default 1), EMPTY, RECREATE (1: caches freed and re-created
at agreed steps; default 1 in random mode, 0 in churn mode), TIMING (1: where each step's time
goes, first 10% of the steps against the last; see Timeline). Prints one JSON line per rank; a
failure names the seed, the step and the program so far.
"""

import ctypes as C
import json
import os
import random
import sys
import time

import torch

lib = C.CDLL(os.environ["NVFIPC_LIB"])
lib.nvfipc_last_error_message.restype = C.c_char_p
SEND, RECV, DEVICE = 0, 1, 0
MIB = 1 << 20
CHURN_SIZES = [4096, MIB, 3 * MIB, 24 * MIB, 70 * MIB, 333_333]
TIMEOUT_MS = 60000


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


class DriverClock(C.Structure):
    _fields_ = [(f"{call}_{what}", C.c_uint64)
                for call in ("export", "fd_pass", "import", "reserve", "map", "set_access", "close")
                for what in ("ns", "calls")]


CALL_PATH = ("export", "fd_pass", "import", "reserve", "map", "set_access")


class Failure(Exception):
    pass


class Timeline:
    """Where each step's time goes (TIMING=1): PyTorch's part (allocations, fills, empty_cache),
    the exchange call, the driver calls made inside it (the library's driver clock), and the rest
    (reads through the mappings, checks, barriers); plus the process's memory and descriptors.
    Reported as the median over the first and the last 10% of the steps, and their ratio."""

    def __init__(self, steps):
        self.rows = []
        self.tenth = max(1, steps // 10)
        self.samples = {}
        check(lib.nvfipc_cuda_driver_clock(1, None), "driver clock on")

    @staticmethod
    def process():
        with open("/proc/self/statm") as f:
            rss_pages = int(f.read().split()[1])
        return {"rss_mib": round(rss_pages * os.sysconf("SC_PAGE_SIZE") / MIB, 1),
                "fds": len(os.listdir("/proc/self/fd")),
                "torch_reserved_mib": round(torch.cuda.memory_reserved() / MIB, 1)}

    def step(self, step, torch_ns, exchange_ns, rest_ns):
        clock = DriverClock()
        check(lib.nvfipc_cuda_driver_clock(1, C.byref(clock)), "driver clock")
        driver_ns = sum(getattr(clock, f"{c}_ns") for c in CALL_PATH)
        self.rows.append((torch_ns + exchange_ns + rest_ns, torch_ns, exchange_ns, driver_ns,
                          exchange_ns - driver_ns, rest_ns, clock.close_ns))
        if step + 1 == self.tenth:
            self.samples["after_first_tenth"] = self.process()

    def report(self):
        check(lib.nvfipc_cuda_driver_clock(0, None), "driver clock off")
        self.samples["end"] = self.process()
        names = ("step", "torch", "exchange", "exchange_driver", "exchange_library", "rest",
                 "releaser_close")
        first, last = self.rows[:self.tenth], self.rows[-self.tenth:]

        def p50(rows, i):
            values = sorted(r[i] for r in rows)
            return values[len(values) // 2]

        out = {}
        for i, name in enumerate(names):
            a, b = p50(first, i), p50(last, i)
            out[name] = {"first_us": round(a / 1e3, 1), "last_us": round(b / 1e3, 1),
                         "ratio": round(b / a, 2) if a else None}
        out["process"] = self.samples
        return out


class AllocationProp(C.Structure):
    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("loc_type", C.c_int),
                ("loc_id", C.c_int), ("win32HandleMetaData", C.c_void_p),
                ("allocFlags", C.c_uint8 * 8)]


class AccessDesc(C.Structure):
    _fields_ = [("loc_type", C.c_int), ("loc_id", C.c_int), ("flags", C.c_int)]


PINNED, POSIX_FD, LOCATION_DEVICE, READWRITE = 1, 1, 1, 3


class VmmArena:
    """An expandable-segments-like allocator (see the module docs). First fit over the reserved
    range, so freed addresses are handed out again."""

    CHUNK = 2 * MIB

    def __init__(self, reserve=16 << 30):
        self.cu = C.CDLL("libcuda.so.1")
        base = C.c_uint64()
        self._check(self.cu.cuMemAddressReserve(C.byref(base), C.c_size_t(reserve),
                                                C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)),
                    "cuMemAddressReserve")
        self.base, self.size = base.value, reserve
        self.free = [(0, reserve)]
        self.handles = {}  # chunk index -> physical allocation
        self.users = {}  # chunk index -> live allocations on it
        self.chunks_made = 0
        self.chunks_released = 0
        self.prop = AllocationProp(PINNED, POSIX_FD, LOCATION_DEVICE, 0, None)
        self.access = AccessDesc(LOCATION_DEVICE, 0, READWRITE)

    def _check(self, rc, what):
        if rc != 0:
            raise Failure(f"{what}: CUresult {rc}")

    def _chunks(self, start, n):
        return range(start // self.CHUNK, (start + n - 1) // self.CHUNK + 1)

    def alloc(self, n):
        n = (n + 511) // 512 * 512
        for i, (s, e) in enumerate(self.free):
            if e - s >= n:
                self.free[i:i + 1] = [] if s + n == e else [(s + n, e)]
                break
        else:
            raise Failure(f"arena of {self.size} bytes full")
        for c in self._chunks(s, n):
            if c not in self.handles:
                h = C.c_uint64()
                self._check(self.cu.cuMemCreate(C.byref(h), C.c_size_t(self.CHUNK),
                                                C.byref(self.prop), C.c_uint64(0)), "cuMemCreate")
                at = C.c_uint64(self.base + c * self.CHUNK)
                self._check(self.cu.cuMemMap(at, C.c_size_t(self.CHUNK), C.c_size_t(0), h,
                                             C.c_uint64(0)), "cuMemMap")
                self._check(self.cu.cuMemSetAccess(at, C.c_size_t(self.CHUNK),
                                                   C.byref(self.access), C.c_size_t(1)),
                            "cuMemSetAccess")
                self.handles[c] = h
                self.chunks_made += 1
            self.users[c] = self.users.get(c, 0) + 1
        return ArenaBlock(self, s, n)

    def release(self, s, n):
        for c in self._chunks(s, n):
            self.users[c] -= 1
        self.free.append((s, s + n))
        self.free.sort()
        merged = []
        for a, b in self.free:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        self.free = merged

    def empty_cache(self):
        torch.cuda.synchronize()
        for c in [c for c, u in self.users.items() if u == 0]:
            at = C.c_uint64(self.base + c * self.CHUNK)
            self._check(self.cu.cuMemUnmap(at, C.c_size_t(self.CHUNK)), "cuMemUnmap")
            self._check(self.cu.cuMemRelease(self.handles.pop(c)), "cuMemRelease")
            del self.users[c]
            self.chunks_released += 1

    def close(self):
        self.empty_cache()
        if not self.handles:
            self.cu.cuMemAddressFree(C.c_uint64(self.base), C.c_size_t(self.size))


class PoolProps(C.Structure):
    _fields_ = [("allocType", C.c_int), ("handleTypes", C.c_int), ("loc_type", C.c_int),
                ("loc_id", C.c_int), ("win32SecurityAttributes", C.c_void_p),
                ("maxSize", C.c_size_t), ("usage", C.c_ushort), ("reserved", C.c_uint8 * 54)]


class PoolArena:
    """Allocations from an IPC-capable stream-ordered pool; frees wait for `release_freed()`."""

    def __init__(self):
        self.cu = C.CDLL("libcuda.so.1")
        self.pool = C.c_void_p()
        props = PoolProps(PINNED, POSIX_FD, LOCATION_DEVICE, 0, None, 0, 0)
        rc = self.cu.cuMemPoolCreate(C.byref(self.pool), C.byref(props))
        if rc != 0:
            raise Failure(f"cuMemPoolCreate: CUresult {rc}")
        self.pending = []
        self.allocated = 0
        self.freed = 0

    def alloc(self, n):
        ptr = C.c_uint64()
        rc = self.cu.cuMemAllocFromPoolAsync(C.byref(ptr), C.c_size_t(n), self.pool,
                                             C.c_void_p(0))
        if rc != 0:
            raise Failure(f"cuMemAllocFromPoolAsync({n}): CUresult {rc}")
        torch.cuda.synchronize()
        self.allocated += 1
        return ArenaBlock(self, ptr.value, n, base=0)

    def release(self, ptr, n):
        self.pending.append(ptr)

    def release_freed(self):
        """Frees what was dropped: only once no peer holds an import of it."""
        for ptr in self.pending:
            rc = self.cu.cuMemFreeAsync(C.c_uint64(ptr), C.c_void_p(0))
            if rc != 0:
                raise Failure(f"cuMemFreeAsync: CUresult {rc}")
            self.freed += 1
        self.pending = []
        torch.cuda.synchronize()

    def empty_cache(self):
        torch.cuda.synchronize()
        self.cu.cuMemPoolTrimTo(self.pool, C.c_size_t(0))

    def close(self):
        self.release_freed()
        self.empty_cache()
        self.cu.cuMemPoolDestroy(self.pool)


class ArenaBlock:
    """An allocation of a VmmArena, freed when the last reference goes."""

    def __init__(self, arena, start, n, base=None):
        self.arena, self.start, self.n = arena, start, n
        self.ptr = (arena.base if base is None else base) + start

    def tensor(self, offset, n):
        return torch.as_tensor(PeerView(self.ptr + offset, n), device="cuda")

    def __del__(self):
        self.arena.release(self.start, self.n)


def check(status, what):
    if status != 0:
        raise Failure(f"{what}: status {status}: "
                      f"{lib.nvfipc_last_error_message().decode(errors='replace')}")


class PeerView:
    """A byte tensor over a peer pointer (the CUDA array interface; nothing is copied)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3}


def value(rank, step, slot, what):
    """The byte a rank writes at a step: distinct per rank, step, request and purpose."""
    return (rank * 37 + step * 11 + slot * 5 + what * 101 + 1) % 251 + 1


def plan(mode, seed, steps, recreate, empty=True):
    """The agreed program (equal on every rank): per step the tags of the batch, whether the
    two sides list it in different orders, how long tensors live, and the lifecycle events."""
    rng = random.Random(seed)
    program = []
    for step in range(steps):
        if mode == "churn":
            program.append({"tags": [f"t{step % 3}"], "reverse": False, "keep": 2,
                            "empty": empty and step > 0 and step % 5 == 0, "recreate": False,
                            "sizes": [None], "offset": 0, "same": True})
            continue
        n = rng.choice([1, 1, 2, 3])
        tags = [rng.choice(["a", "b", "c", "d"]) for _ in range(n)]
        program.append({
            "tags": tags,
            "reverse": rng.random() < 0.3,
            "keep": rng.choice([1, 2, 3, 4]),
            "empty": rng.random() < 0.12,
            "recreate": recreate and step > 0 and rng.random() < 0.06,
            "sizes": [rng.choice([4096, 65536, 333_333, MIB, 3 * MIB, 24 * MIB, 70 * MIB])
                      for _ in range(n)],
            # A view this far into a larger tensor (0: the tensor itself).
            "offset": rng.choice([0, 0, 512, 4096, 3 * MIB + 256]),
        })
    return program


def counters():
    c = VmmCounters()
    check(lib.nvfipc_cuda_vmm_counters_get(C.byref(c)), "vmm counters")
    return {n: getattr(c, n) for n, _ in VmmCounters._fields_}


def main():
    mode = os.environ.get("MODE", "random")
    steps = int(os.environ.get("STEPS", "200"))
    seed = int(os.environ.get("SEED", "1"))
    recreate = os.environ.get("RECREATE", "1" if mode == "random" else "0") == "1"
    ctx = C.c_void_p()
    check(lib.nvfipc_context_from_env(C.byref(ctx)), "context")
    rank, world = C.c_int64(), C.c_int64()
    lib.nvfipc_context_rank(ctx, C.byref(rank))
    lib.nvfipc_context_world_size(ctx, C.byref(world))
    rank, world = rank.value, world.value
    torch.cuda.set_device(0)
    torch.cuda.synchronize()  # PyTorch's context is current from here on
    alloc = os.environ.get("ALLOC", "torch")
    arena = {"vmm": VmmArena, "pool": PoolArena}.get(alloc, lambda: None)()
    if alloc == "pool":
        recreate = True
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    program = plan(mode, seed, steps, recreate, os.environ.get("EMPTY", "1") == "1")
    # Sizes differ per rank (asymmetric changes): each rank draws its own from the agreed ones.
    own = random.Random(seed * 1000 + rank)

    def barrier(what):
        check(lib.nvfipc_barrier(ctx, None, C.c_size_t(0), C.c_int64(TIMEOUT_MS)), what)

    cache = C.c_void_p()
    check(lib.nvfipc_cache_create(ctx, C.byref(cache)), "cache")
    out = {"rank": rank, "world": world, "mode": mode, "seed": seed, "steps": steps,
           "alloc": alloc,
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""), "caches": 1,
           "empty_cache": 0, "bytes_checked": 0}
    live = []  # (step it dies after, tensors)
    done = 0
    timeline = Timeline(steps) if os.environ.get("TIMING") == "1" else None
    t0 = time.perf_counter()
    try:
        for step, p in enumerate(program):
            step_start = time.perf_counter_ns()
            if p["recreate"]:
                barrier(f"barrier before re-creating the cache at step {step}")
                check(lib.nvfipc_cache_free(cache), f"cache free at step {step}")
                if alloc == "pool":
                    arena.release_freed()
                cache = C.c_void_p()
                check(lib.nvfipc_cache_create(ctx, C.byref(cache)), f"cache at step {step}")
                out["caches"] += 1
            if p["empty"]:
                live.clear()
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                if arena:
                    arena.empty_cache()
                out["empty_cache"] += 1
            # Fresh send and receive tensors for each request of the batch.
            items = []
            for slot, (tag, size) in enumerate(zip(p["tags"], p["sizes"])):
                if size is None:
                    size = own.choice(CHURN_SIZES)
                elif own.random() < 0.5:
                    size = own.choice([4096, 333_333, MIB, 3 * MIB, 24 * MIB])
                off = p["offset"]
                if arena:
                    whole = (arena.alloc(size + off), arena.alloc(size))
                    send = whole[0].tensor(off, size)
                else:
                    whole = torch.empty(size + off, dtype=torch.uint8, device="cuda")
                    send = whole[off:]
                send.fill_(value(rank, step, slot, 0))
                # One tensor both sent and received (read through the mapping only), or a
                # receive tensor of its own that the previous rank writes into.
                if p.get("same"):
                    recv = send
                elif arena:
                    recv = whole[1].tensor(0, size)
                    recv.zero_()
                else:
                    recv = torch.zeros(size, dtype=torch.uint8, device="cuda")
                items.append((tag, send, recv, whole))
            torch.cuda.synchronize()
            tags = [C.c_char_p(t.encode()) for t, *_ in items]
            reqs = []
            for slot, (tag, send, recv, _) in enumerate(items):
                reqs.append(Request(nxt, SEND, DEVICE, tags[slot], send.data_ptr(), send.numel()))
                reqs.append(Request(prev, RECV, DEVICE, tags[slot], recv.data_ptr(),
                                    recv.numel()))
            if p["reverse"] and rank % 2 == 1:
                # Receives first: another order than the peers', keeping the order among equal
                # tags (their occurrences pair up in order).
                reqs.sort(key=lambda r: r.direction != RECV)
            batch = (Request * len(reqs))(*reqs)
            exchange_start = time.perf_counter_ns()
            check(lib.nvfipc_exchange_handles_timeout(cache, batch, C.c_size_t(len(reqs)),
                                                      C.c_int64(TIMEOUT_MS)),
                  f"exchange at step {step}")
            exchange_end = time.perf_counter_ns()
            # Read the previous rank's send tensor through the RECV handle, and write into the
            # next rank's receive tensor through the SEND handle.
            by_key = {(r.direction, r.tag, r.ptr): i for i, r in enumerate(batch)}
            for slot, (tag, send, recv, _) in enumerate(items):
                hr, hs = Handle(), Handle()
                r_req = batch[by_key[(RECV, tags[slot].value, recv.data_ptr())]]
                s_req = batch[by_key[(SEND, tags[slot].value, send.data_ptr())]]
                check(lib.nvfipc_cache_get(cache, C.byref(r_req), C.byref(hr)), "get recv")
                check(lib.nvfipc_cache_get(cache, C.byref(s_req), C.byref(hs)), "get send")
                # The peer's size is its own draw: compare what both have.
                n = min(hr.peer_bytes, recv.numel())
                peer = torch.as_tensor(PeerView(hr.peer_ptr, n), device="cuda")
                want = value(prev, step, slot, 0)
                bad = int((peer != want).sum())
                if bad:
                    raise Failure(f"step {step} tag {tag}: {bad} of {n} bytes read from rank "
                                  f"{prev} differ from {want}")
                if not p.get("same"):
                    m = min(hs.peer_bytes, send.numel())
                    torch.as_tensor(PeerView(hs.peer_ptr, m), device="cuda").fill_(
                        value(rank, step, slot, 1))
                out["bytes_checked"] += n
            torch.cuda.synchronize()
            barrier(f"barrier after the writes of step {step}")
            for slot, (tag, send, recv, _) in enumerate(items):
                if p.get("same"):
                    break
                # The previous rank wrote min(its send size, this recv size) bytes.
                h = Handle()
                r_req = batch[by_key[(RECV, tags[slot].value, recv.data_ptr())]]
                check(lib.nvfipc_cache_get(cache, C.byref(r_req), C.byref(h)), "get recv")
                n = min(h.peer_bytes, recv.numel())
                want = value(prev, step, slot, 1)
                bad = int((recv[:n] != want).sum())
                if bad:
                    raise Failure(f"step {step} tag {tag}: {bad} of {n} bytes rank {prev} wrote "
                                  f"here differ from {want}")
            # Every peer is done with this step's tensors before any is freed.
            barrier(f"barrier after the checks of step {step}")
            live.append((step + p["keep"], items))
            live = [(until, its) for until, its in live if until > step]
            done = step + 1
            if timeline:
                timeline.step(step, exchange_start - step_start, exchange_end - exchange_start,
                              time.perf_counter_ns() - exchange_end)
        barrier("final barrier")
        items = whole = send = recv = None
        live.clear()
        torch.cuda.synchronize()
        check(lib.nvfipc_cache_free(cache), "final cache free")
        cache = None
        check(lib.nvfipc_cuda_ipc_flush_releases(C.c_int64(TIMEOUT_MS)), "flush")
        if alloc == "vmm":
            arena.close()
            out["arena_chunks"] = {"made": arena.chunks_made,
                                   "released": arena.chunks_released}
        elif alloc == "pool":
            arena.close()
            out["pool_allocations"] = {"made": arena.allocated, "freed": arena.freed}
        end = counters()
        ipc = (C.c_uint64 * 5)()
        lib.nvfipc_cuda_ipc_counters_get(ipc)
        out["vmm"] = end
        out["ipc"] = {"opens": ipc[0], "closes": ipc[1], "live": ipc[2]}
        balanced = (end["segment_imports"] == end["segment_releases"]
                    and end["maps"] == end["unmaps"] and end["live_segments"] == 0
                    and end["live_maps"] == 0 and ipc[0] == ipc[1])
        if not balanced:
            raise Failure(f"imports not balanced after teardown: vmm {end}, ipc {out['ipc']}")
        if timeline:
            out["timing"] = timeline.report()
        out["ok"] = True
    except Failure as e:
        out["ok"] = False
        out["error"] = str(e)
        out["program_so_far"] = program[:done + 1][-6:]
    out["steps_done"] = done
    out["seconds"] = round(time.perf_counter() - t0, 2)
    print(json.dumps(out), flush=True)
    if cache:
        lib.nvfipc_cache_free(cache)
    lib.nvfipc_context_free(ctx)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
