"""A torch TCPStore master driven line by line from stdin (used by tests/store_interop.rs).

Usage: torch_server.py --libuv 0|1 [--world-size N]

Prints "port N" once the listening socket exists, then "ready" once the TCPStore constructor has
returned (with --world-size N that is only after N clients have sent ADD "init/" 1), then answers
one command per line on stdin. Binary values travel as hex:
  set KEY HEX | get KEY | len KEY | check KEY... | delete KEY | num_keys | list (list_keys)
  | queue_push KEY HEX | quit
Replies: "ok", "value X", "true"/"false", "keys HEX...", or "error MESSAGE".
"""

import argparse
import datetime
import os
import socket
import sys

import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libuv", type=int, choices=(0, 1), required=True)
    ap.add_argument("--world-size", type=int, default=None)
    args = ap.parse_args()

    # Bind first so that the port is known before a world_size master's constructor blocks.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    print("port", sock.getsockname()[1], flush=True)
    store = dist.TCPStore(
        "127.0.0.1",
        sock.getsockname()[1],
        args.world_size,
        True,
        datetime.timedelta(seconds=30),
        wait_for_workers=args.world_size is not None,
        master_listen_fd=sock.fileno(),
        use_libuv=bool(args.libuv),
    )
    assert store.libuvBackend == bool(args.libuv)
    print("ready", flush=True)

    for line in sys.stdin:
        parts = line.split()
        if not parts:
            continue
        cmd, rest = parts[0], parts[1:]
        try:
            if cmd == "quit":
                print("ok", flush=True)
                # Skip interpreter teardown: torch 2.11's classic server daemon can abort
                # ("Unexpected poll revent on the control pipe") when destroyed while clients
                # are still connected.
                os._exit(0)
            elif cmd == "set":
                store.set(rest[0], bytes.fromhex(rest[1] if len(rest) > 1 else ""))
                reply = "ok"
            elif cmd == "get":
                reply = "value " + store.get(rest[0]).hex()
            elif cmd == "len":
                reply = "value %d" % len(store.get(rest[0]))
            elif cmd == "check":
                reply = "true" if store.check(rest) else "false"
            elif cmd == "delete":
                reply = "true" if store.delete_key(rest[0]) else "false"
            elif cmd == "num_keys":
                reply = "value %d" % store.num_keys()
            elif cmd == "list":
                reply = " ".join(["keys"] + sorted(k.encode().hex() for k in store.list_keys()))
            elif cmd == "queue_push":
                store.queue_push(rest[0], bytes.fromhex(rest[1]))
                # QUEUE_PUSH has no reply on the wire: a request that has one, on the same
                # connection, makes "ok" mean the server has applied the push.
                store.queue_len(rest[0])
                reply = "ok"
            else:
                reply = "error unknown command " + cmd
        except Exception as e:  # reported to the Rust side, which decides
            reply = "error %s: %s" % (type(e).__name__, str(e).replace("\n", " "))
        print(reply, flush=True)


if __name__ == "__main__":
    main()
