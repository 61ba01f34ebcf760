"""PyTorch's own symmetric-memory rendezvous, timed the way tests/gpu/torch_symmetric.py times
ours: the baseline of the rendezvous curve in docs/BENCHMARKS.md.

Run under mpirun, each rank on device `local rank % device count` (PyTorch's symmetric memory
refuses ranks that share a GPU: "detected allocations from overlapping devices from different
ranks", so it needs as many GPUs as ranks), e.g.
    mpirun -np 4 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29971 python3 torch_symm_mem_baseline.py

Each rank joins a gloo process group over torch's TCPStore, then for ROUNDS rounds: allocates a
fresh tensor of MIB MiB with `torch.distributed._symmetric_memory.empty`, fills it with its rank,
passes a barrier (so start-up skew is not counted), times `rendezvous(tensor, group)`, and checks
one element of every peer's buffer through the handle. Prints one JSON line per rank:
{"rank", "world", "ok", "first_us" (the first round), "median_us" (the other rounds), "error"}.
A rank that cannot run PyTorch's symmetric memory here prints ok=false with the error; the
comparison then says so instead of a number.
"""
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

RANK = int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")))
LOCAL_RANK = int(os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", os.environ.get("LOCAL_RANK", str(RANK))))
WORLD = int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
MIB = int(os.environ.get("MIB", "64"))
ROUNDS = int(os.environ.get("ROUNDS", "6"))


def main() -> dict:
    out = {"rank": RANK, "world": WORLD, "ok": False, "mib": MIB}
    device = LOCAL_RANK % torch.cuda.device_count()
    torch.cuda.set_device(device)
    out["device"] = device
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=RANK,
        world_size=WORLD,
    )
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group = dist.group.WORLD
        enable = getattr(symm_mem, "enable_symm_mem_for_group", None)
        if enable is not None:
            enable(group.group_name)
        times = []
        keep = []  # PyTorch caches rendezvous per allocation: keep them alive, fresh each round
        for _ in range(ROUNDS):
            t = symm_mem.empty(MIB * (1 << 20) // 4, dtype=torch.int32, device=f"cuda:{device}")
            t.fill_(RANK)
            torch.cuda.synchronize()
            dist.barrier()
            start = time.perf_counter()
            handle = symm_mem.rendezvous(t, group)
            times.append((time.perf_counter() - start) * 1e6)
            for peer in range(WORLD):
                buf = handle.get_buffer(peer, (1,), torch.int32)
                if int(buf.item()) != peer:
                    raise RuntimeError(f"rank {peer}'s buffer holds {int(buf.item())}")
            keep.append((t, handle))
        out["first_us"] = times[0]
        out["median_us"] = statistics.median(times[1:]) if len(times) > 1 else times[0]
        out["ok"] = True
        dist.barrier()
    except Exception as e:  # reported, not raised: the comparison names why there is no number
        out["error"] = f"{type(e).__name__}: {e}"
    return out


if __name__ == "__main__":
    result = main()
    print(json.dumps(result), flush=True)
    try:
        dist.destroy_process_group()
    except Exception:
        pass
