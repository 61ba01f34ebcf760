"""Ranks exchange host buffers and copy each other's data: runs on any Linux machine, with no GPU
and no PyTorch.

    nvfipc launch -n 2 -- python3 examples/python/host_exchange.py

Each rank fills a buffer of shared memory with its own byte and sends it to the next rank of a
ring; it receives the previous rank's into a second buffer. The exchange maps the sender's buffer
into the receiver (read here with no copy), and a host transfer copies it (the sender posts, the
receiver pulls, the sender waits until it was pulled). Exits non-zero when a byte is wrong.
"""

import sys

import nvfuser_ipc as nv

NBYTES = 1 << 20


def main() -> int:
    # Rank, world size and store from the launcher (nvfipc launch, torchrun, mpirun, srun).
    with nv.Context.from_env() as ctx:
        rank, world = ctx.rank, ctx.world_size
        if world < 2:
            print(f"{sys.argv[0]} needs 2 or more ranks: nvfipc launch -n 2 -- python3 "
                  f"{sys.argv[0]}", file=sys.stderr)
            return 2
        nxt, prv = (rank + 1) % world, (rank - 1) % world
        mine, theirs = bytes([rank % 256]) * NBYTES, bytes([prv % 256]) * NBYTES

        # Shared memory that peers can map. A view must be released before free().
        send, recv = nv.HostBuffer(NBYTES), nv.HostBuffer(NBYTES)
        with send.view() as view:
            view[:] = mine

        # Both sides name the communication by the same tag; each rank makes the matching call.
        reqs = [nv.Request(nxt, nv.SEND, "ring", send), nv.Request(prv, nv.RECV, "ring", recv)]
        with nv.Cache(ctx) as cache:
            mapped = cache.exchange(reqs)
            with mapped[1].peer as peer:  # the previous rank's send buffer, mapped here
                mapped_ok = peer == theirs
            cache.host_send_post(reqs[0])  # "my send buffer is ready"
            cache.host_recv_post(reqs[1])  # waits for the sender's post, copies, signals it
            cache.host_send_wait(reqs[0])  # waits until the next rank has copied mine
            with recv.view() as view:
                copied_ok = view == theirs
        # The cache is closed: every peer has closed its own, so the buffers may go.
        send.free()
        recv.free()
    if not (mapped_ok and copied_ok):
        print(f"rank {rank}: rank {prv}'s bytes differ (mapped: {mapped_ok}, copied: "
              f"{copied_ok})", file=sys.stderr)
        return 1
    print(f"rank {rank} of {world}: rank {prv}'s {NBYTES} bytes read mapped and copied, correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
