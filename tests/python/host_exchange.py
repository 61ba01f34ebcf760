"""The Python API across processes with host buffers, run by every rank of a job:

    nvfipc launch -n 3 -- python tests/python/host_exchange.py [env|torch]

env: the context from the launcher's environment; torch: over a torch.distributed.TCPStore that
rank 0 hosts (through the library's host-callback store). Each rank sends 1 MiB to rank+1 and receives
rank-1's: the peer's buffer mapped here holds its bytes, a host transfer copies them, a second
exchange of the same buffers is a cache hit, the log hook receives lines, and a bad request
raises NvfipcError carrying the library's message. Exits non-zero on any failure.
"""

import os
import sys

import nvfuser_ipc as nv

MIB = 1 << 20


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else "env"
    lines = []
    nv.set_log_callback(lambda level, subsystem, line: lines.append((level, subsystem, line)))
    nv.set_log_level(nv.LOG_INFO)
    if mode == "torch":
        import torch.distributed as dist

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        addr = os.environ["MASTER_ADDR"]
        # Rank 0 hosts a TCPStore of torch's own on a port the kernel picks, and tells the others
        # through the launcher's store (which speaks the same protocol): no port guessed.
        launcher = dist.TCPStore(addr, int(os.environ["MASTER_PORT"]), world, is_master=False)
        if rank == 0:
            store = dist.TCPStore(addr, 0, world, is_master=True, wait_for_workers=False)
            launcher.set("host_exchange/torch_port", str(store.port))
        else:
            port = int(launcher.get("host_exchange/torch_port"))
            store = dist.TCPStore(addr, port, world, is_master=False)
        ctx = nv.Context.from_torch_store(store, rank, world)
    else:
        ctx = nv.Context.from_env()
    rank, world = ctx.rank, ctx.world_size
    assert world >= 2, world
    nxt, prv = (rank + 1) % world, (rank + world - 1) % world
    with ctx, nv.Cache(ctx) as cache:
        send, recv = nv.HostBuffer(MIB), nv.HostBuffer(MIB)
        send.view()[:] = bytes([rank % 251 + 1]) * MIB
        reqs = [nv.Request(nxt, nv.SEND, "ring", send), nv.Request(prv, nv.RECV, "ring", recv)]
        mapped = cache.exchange(reqs)
        # The sender's buffer, mapped here.
        peer_view = mapped[1].peer
        assert mapped[1].peer_bytes == MIB, mapped[1]
        assert peer_view is not None and peer_view[0] == prv % 251 + 1, peer_view[:4].tolist()
        cache.host_send_post(reqs[0])
        cache.host_recv_post(reqs[1], timeout=20)
        cache.host_send_wait(reqs[0], timeout=20)
        assert bytes(recv.view()) == bytes([prv % 251 + 1]) * MIB, "received bytes differ"
        before = cache.counters()
        cache.exchange(reqs)
        after = cache.counters()
        assert after["hits"] > before["hits"] and after["store_round_trips"] == before[
            "store_round_trips"], (before, after)
        try:
            cache.exchange([nv.Request(world + 5, nv.SEND, "bad", send)])
            raise AssertionError("a request to a rank outside the world was accepted")
        except nv.NvfipcError as e:
            assert e.status_name == "invalid argument", e
            assert str(world + 5) in e.message, e.message
        ctx.barrier(timeout=20)
        ctx.barrier([0, 1], timeout=20) if rank < 2 else None
    assert any(sub == "exchange" and "created" in line for _, sub, line in lines), lines[:5]
    nv.set_log_callback(None)
    send.free()
    recv.free()
    print(f"rank {rank} of {world} ({mode}): exchange, transfer, cache hit, errors and log hook "
          f"all correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
