"""One rank of a 2-rank gloo job whose rendezvous store is a TCPStore server at
127.0.0.1:PORT (our embedded server in tests/store_interop.rs).

Usage: gloo_rank.py RANK PORT
"""

import datetime as dt
import sys

import torch
import torch.distributed as dist


def main():
    rank, port = int(sys.argv[1]), int(sys.argv[2])
    timeout = dt.timedelta(seconds=60)
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    t = torch.tensor([float(rank + 1), 10.0 * (rank + 1)])
    dist.all_reduce(t)
    assert t.tolist() == [3.0, 30.0], t.tolist()
    dist.barrier()
    dist.destroy_process_group()
    print("OK rank %d sum %s" % (rank, t.tolist()), flush=True)


if __name__ == "__main__":
    main()
