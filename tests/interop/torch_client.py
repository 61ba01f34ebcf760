"""torch's TCPStore client exercising every operation against a store server at 127.0.0.1:PORT
(our embedded server in tests/store_interop.rs). Exits non-zero on the first failed check.

Usage: torch_client.py PORT

Expects the Rust side to have set "from_rust" = b"\\x00rust\\xff" first; prints
"waiting rust_late" and blocks in get("rust_late") until the Rust side sets it; sets
"from_python" = b"\\xffpy\\x00"; prints "OK" at the end.
"""

import datetime as dt
import sys

import torch
import torch.distributed as dist

T = dt.timedelta(seconds=20)


def expect_store_error(fn, text):
    try:
        fn()
    except dist.DistStoreError as e:
        assert text in str(e), "DistStoreError text %r lacks %r" % (str(e), text)
        return str(e)
    raise AssertionError("expected DistStoreError containing %r" % text)


def main():
    port = int(sys.argv[1])
    print("torch", torch.__version__, flush=True)
    c = dist.TCPStore("127.0.0.1", port, world_size=None, is_master=False, timeout=T,
                      wait_for_workers=False)

    assert c.get("from_rust") == b"\x00rust\xff"

    c.set("k", "v")
    assert c.get("k") == b"v"
    assert c.add("n", 3) == 3 and c.get("n") == b"3"
    assert c.add("n", -5) == -2
    assert c.check(["k"]) and c.check(["k", "n"]) and not c.check(["k", "zz"])

    # compare_set, every branch
    assert c.compare_set("k", "v", "w") == b"w"          # matches: replaced
    assert c.compare_set("k", "bad", "zzz") == b"w"      # differs: current value
    assert c.compare_set("m", "e", "v1") == b"e"         # missing, expected set: expected
    assert not c.check(["m"])
    assert c.compare_set("m", "", "v1") == b"v1"         # missing, expected empty: created
    assert c.get("m") == b"v1"

    c.append("k", "+")
    assert c.get("k") == b"w+"
    c.append("fresh", "x")
    assert c.get("fresh") == b"x"

    c.multi_set(["a", "b"], ["1", "2"])
    assert c.multi_get(["a", "b"]) == [b"1", b"2"]
    assert c.delete_key("a") and not c.delete_key("a")

    c.set("bin", b"\x00\xff\x00")
    assert c.get("bin") == b"\x00\xff\x00"

    # wait: satisfied at once, satisfied later by the Rust side, and timing out.
    c.wait(["k", "b"])
    c.wait(["k"], dt.timedelta(seconds=5))
    print("waiting rust_late", flush=True)
    assert c.get("rust_late") == b"late"
    msg = expect_store_error(lambda: c.wait(["never"], dt.timedelta(milliseconds=500)),
                             "wait timeout after 500ms, keys: /never")
    print("wait timeout:", msg, flush=True)
    assert c.get("k") == b"w+"  # CANCEL_WAIT left the connection in step
    c.set_timeout(dt.timedelta(milliseconds=300))
    expect_store_error(lambda: c.get("never2"), "wait timeout after 300ms, keys: /never2")
    c.set_timeout(T)

    # queues
    c.queue_push("q", "x")
    c.queue_push("q", b"\x00y")
    assert c.queue_len("q") == 2
    assert c.queue_pop("q") == b"x"
    assert c.queue_pop("q", block=False) == b"\x00y"
    assert c.queue_len("q") == 0
    try:
        c.queue_pop("q", block=False)
        raise AssertionError("expected QueueEmptyError")
    except dist.QueueEmptyError:
        pass

    # PrefixStore puts "pfx/" before the key (on the wire "/pfx/k").
    p = dist.PrefixStore("pfx", c)
    p.set("k", "pv")
    assert p.get("k") == b"pv" and c.get("pfx/k") == b"pv"

    # Store.barrier (torch >= 2.15 sends BARRIER, command 18): a world of one passes at once; a
    # world of two times out alone (CANCEL_WAIT) but its arrival counts, so the next passes.
    barrier_keys = []
    if hasattr(c, "barrier"):
        c.barrier("bk", 1)
        expect_store_error(lambda: c.barrier("b2", 2, dt.timedelta(milliseconds=300)),
                           "barrier timeout after 300ms")
        c.barrier("b2", 2, dt.timedelta(seconds=5))
        assert c.get("b2") == b"2", c.get("b2")
        assert c.get("k") == b"w+"  # the connection stayed in step
        barrier_keys = ["bk", "b2"]
        print("barrier: OK", flush=True)
    else:
        print("barrier: not in this torch", flush=True)

    # A clone is a second connection to the same server (torch >= 2.4).
    if hasattr(c, "clone"):
        assert c.clone().get("k") == b"w+"

    c.set("from_python", b"\xffpy\x00")
    keys = sorted(c.list_keys())
    expected = sorted(["from_rust", "rust_late", "k", "n", "m", "fresh", "b", "bin", "pfx/k",
                       "from_python"] + barrier_keys)
    assert keys == expected, keys
    n = c.num_keys()
    assert n == len(expected), n

    # A client with world_size announces itself with ADD "init/" 1 (checked by the Rust side).
    w = dist.TCPStore("127.0.0.1", port, world_size=2, is_master=False, timeout=T,
                      wait_for_workers=True)
    assert w.get("k") == b"w+"
    assert c.num_keys() == n + 1  # init/ counts, but list() hides it
    assert sorted(c.list_keys()) == expected
    print("OK", flush=True)


if __name__ == "__main__":
    main()
