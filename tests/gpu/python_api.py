"""The Python API with real CUDA tensors, run by every rank of a job on a GPU machine:

    for conf in "" expandable_segments:True; do
      for np in 2 4; do
        PYTORCH_CUDA_ALLOC_CONF=$conf PYTHONPATH=python \\
          mpirun -np $np --allow-run-as-root python tests/gpu/python_api.py
      done
    done

(`bash scripts/gpu/python-check.sh` runs exactly that.) Ranks share the visible GPUs
(local rank % device count). Each rank sends a tensor to rank+1 and receives rank-1's, three
iterations with new values in the same tensors: the exchange returns the peer's tensor mapped here
(shaped and typed as the local one), which reads the sender's values; a device transfer
(cuda_send_post / cuda_recv_post / cuda_send_wait on torch's current stream) copies them; the
second and third exchanges are cache hits; with expandable segments the VMM counters show imports
and the maps are released at teardown. Exits non-zero on any failure.
"""

import os
import sys

import torch

import nvfuser_ipc as nv

N = 1 << 20


def main() -> int:
    ctx = nv.Context.from_env()
    rank, world = ctx.rank, ctx.world_size
    torch.cuda.set_device(ctx.local_rank % torch.cuda.device_count())
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") or "default allocator"
    nxt, prv = (rank + 1) % world, (rank + world - 1) % world
    send = torch.empty(N, dtype=torch.float32, device="cuda")
    recv = torch.zeros(N, dtype=torch.float32, device="cuda")
    reqs = [nv.Request(nxt, nv.SEND, "ring", send), nv.Request(prv, nv.RECV, "ring", recv)]
    with nv.Cache(ctx) as cache:
        for it in range(3):
            send.fill_(rank * 100 + it)
            torch.cuda.synchronize()
            before = cache.counters()
            mapped = cache.exchange(reqs)
            ctx.barrier(timeout=60)  # every sender has filled its tensor
            peer = mapped[1].peer
            assert peer.shape == recv.shape and peer.dtype == recv.dtype, (peer.shape, peer.dtype)
            want = float(prv * 100 + it)
            got = peer.clone()
            torch.cuda.synchronize()
            assert bool((got == want).all()), f"mapped peer tensor holds {got[:4]}, want {want}"
            cache.cuda_send_post(reqs[0])
            cache.cuda_recv_post(reqs[1])
            cache.cuda_send_wait(reqs[0])
            torch.cuda.synchronize()
            assert bool((recv == want).all()), f"received {recv[:4]}, want {want}"
            after = cache.counters()
            if it > 0:
                assert after["hits"] > before["hits"], (before, after)
            ctx.barrier(timeout=60)  # nobody refills before every receiver has copied
        counters = cache.counters()
    vmm = nv.vmm_counters()
    if "expandable_segments:True" in conf:
        assert vmm["segment_imports"] > 0, vmm
        assert vmm["segment_imports"] == vmm["segment_releases"], vmm
    ctx.close()
    print(f"rank {rank} of {world} ({conf}): 3 iterations correct; cache {counters['hits']} hits "
          f"{counters['misses']} misses; vmm {vmm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
