"""The host-callback store bridge of Context.from_torch_store, without torch: a thread-safe
in-process store with torch.distributed.Store's methods backs a world of one (context, barrier,
cache, counters), a store that raises gives NvfipcError with the store's own message, and a
TCPStore's address (through PrefixStores) reaches the library."""

import socket
import sys
import threading
import time
from datetime import timedelta

import nvfuser_ipc as nv


class DictStore:
    """torch.distributed.Store's interface over a dict."""

    def __init__(self) -> None:
        self.data: dict = {}
        self.cv = threading.Condition()

    def set(self, key: str, value: bytes) -> None:
        with self.cv:
            self.data[key] = bytes(value)
            self.cv.notify_all()

    def get(self, key: str) -> bytes:
        self.wait([key], timedelta(seconds=30))
        with self.cv:
            return self.data[key]

    def add(self, key: str, delta: int) -> int:
        with self.cv:
            value = int(self.data.get(key, b"0")) + delta
            self.data[key] = str(value).encode()
            self.cv.notify_all()
            return value

    def check(self, keys: list) -> bool:
        with self.cv:
            return all(k in self.data for k in keys)

    def wait(self, keys: list, timeout: timedelta) -> None:
        deadline = time.monotonic() + timeout.total_seconds()
        with self.cv:
            while not all(k in self.data for k in keys):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"Socket Timeout waiting for {keys}")
                self.cv.wait(left)

    def delete_key(self, key: str) -> bool:
        with self.cv:
            return self.data.pop(key, None) is not None

    def compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self.cv:
            current = self.data.get(key)
            if (current is None and not expected) or current == expected:
                self.data[key] = desired
                self.cv.notify_all()
                return desired
            return expected if current is None else current

    def num_keys(self) -> int:
        with self.cv:
            return len(self.data)


class BrokenStore(DictStore):
    def set(self, key: str, value: bytes) -> None:
        raise OSError("the disk holding the store is full")


class AddressedStore(DictStore):
    """A store whose server listens at host:port, as torch's TCPStore says."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__()
        self.host, self.port = host, port


class PrefixOf:
    """torch's PrefixStore: the store it wraps is ``underlying_store``."""

    def __init__(self, inner: object) -> None:
        self.underlying_store = inner


def check_server_address() -> None:
    find = nv._api._tcp_server_address
    assert find(PrefixOf(PrefixOf(AddressedStore("127.0.0.1", 29500)))) == ("127.0.0.1", 29500)
    assert find(DictStore()) is None
    assert find(AddressedStore("127.0.0.1", 0)) is None
    # A server of this process: the context serves the store, and closes at once with no other
    # process connected.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    store = AddressedStore("127.0.0.1", listener.getsockname()[1])
    start = time.monotonic()
    with nv.Context.from_torch_store(store, 0, 1) as ctx:
        ctx.barrier(timeout=10)
    assert time.monotonic() - start < 5, "closing waited for clients that do not exist"
    listener.close()


def main() -> int:
    check_server_address()
    store = DictStore()
    with nv.Context.from_torch_store(store, 0, 1) as ctx:
        assert (ctx.rank, ctx.world_size, ctx.local_rank) == (0, 1, 0)
        assert ctx.job_id
        ctx.barrier(timeout=10)
        ctx.barrier([0], timeout=10)
        with nv.Cache(ctx) as cache:
            assert cache.counters()["exchanges"] == 0
    assert any(k.startswith("nvfipc/") for k in store.data), list(store.data)[:5]
    try:
        nv.Context.from_torch_store(BrokenStore(), 0, 1)
        raise AssertionError("a failing store was accepted")
    except nv.NvfipcError as e:
        assert "the disk holding the store is full" in e.message, e.message
    print("store bridge: context, barriers, cache and errors over a Python store all correct")
    return 0


if __name__ == "__main__":
    sys.exit(main())
