"""Ranks exchange CUDA tensors: each maps the previous rank's tensor and copies it with the device
primitives. Needs PyTorch and a CUDA GPU (ranks share the visible GPUs):

    nvfipc launch -n 2 -- python3 examples/python/cuda_exchange.py

Each rank fills a tensor with its rank number and sends it to the next rank of a ring; it receives
the previous rank's into a second tensor. The exchange maps the sender's tensor into the receiver
(shaped and typed as the local one: read here with no copy), and a device transfer copies it on
torch's current stream (send_post, recv_post, send_wait: enqueued, the host never waits). On a
machine without a GPU or without PyTorch it says so and exits with status 2
(examples/python/host_exchange.py runs anywhere). Exits non-zero when a value is wrong.
"""

import sys

import nvfuser_ipc as nv

NUMEL = 1 << 20


def cuda_missing() -> str:
    """Why this machine cannot run the example, or "" when it can."""
    try:
        import torch
    except ImportError as e:
        return f"PyTorch does not import ({e})"
    if not nv.cuda_available():
        return "the CUDA driver cannot be loaded (no NVIDIA GPU or driver on this machine)"
    if not torch.cuda.is_available():
        return f"torch {torch.__version__} sees no CUDA device"
    return ""


def main() -> int:
    missing = cuda_missing()
    if missing:
        print(f"{sys.argv[0]} needs a CUDA GPU and PyTorch: {missing}; on a machine without "
              f"one run examples/python/host_exchange.py", file=sys.stderr)
        return 2
    import torch

    with nv.Context.from_env() as ctx:
        rank, world = ctx.rank, ctx.world_size
        if world < 2:
            print(f"{sys.argv[0]} needs 2 or more ranks: nvfipc launch -n 2 -- python3 "
                  f"{sys.argv[0]}", file=sys.stderr)
            return 2
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        torch.cuda.set_device(ctx.local_rank % torch.cuda.device_count())
        mine = torch.full((NUMEL,), float(rank), device="cuda")
        theirs = torch.zeros_like(mine)
        torch.cuda.synchronize()  # the next rank reads `mine` as soon as the exchange returns

        reqs = [nv.Request(nxt, nv.SEND, "ring", mine), nv.Request(prv, nv.RECV, "ring", theirs)]
        with nv.Cache(ctx) as cache:
            peer = cache.exchange(reqs)[1].peer  # the previous rank's tensor, mapped here
            mapped_ok = peer.shape == mine.shape and bool((peer == prv).all())
            del peer  # the mapping goes with the cache
            cache.cuda_send_post(reqs[0])
            cache.cuda_recv_post(reqs[1])
            cache.cuda_send_wait(reqs[0])
            torch.cuda.synchronize()  # `theirs` now holds a copy of the previous rank's tensor
            copied_ok = bool((theirs == prv).all())
    if not (mapped_ok and copied_ok):
        print(f"rank {rank}: rank {prv}'s values differ (mapped: {mapped_ok}, copied: "
              f"{copied_ok})", file=sys.stderr)
        return 1
    print(f"rank {rank} of {world} (GPU {torch.cuda.current_device()}): rank {prv}'s "
          f"{NUMEL * 4} bytes read mapped and copied, correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
