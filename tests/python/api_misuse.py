"""Misuse of the Python API is an exception that says what is wrong, never a crash or a silently
wrapped integer. One process, a world of one over an in-process store: no GPU, no launcher.

    python tests/python/api_misuse.py [--require-torch]

- HostBuffer: free() refuses (BufferError) while a view of it exists (a view read after the free
  read unmapped memory) and frees once the views are released or dropped; view() of a freed
  buffer, and a request over one, raise INVALID_STATE naming the buffer.
- Integers that ctypes would wrap (peer 2**64 + 1 became peer 1), negative sizes, bad timeouts,
  tags with a NUL or over NVFIPC_MAX_STRING_LEN raise NvfipcInvalidArgument (a ValueError) naming
  the argument and its value; values of the wrong type raise TypeError.
- A closed cache or context raises INVALID_STATE under the library's own status number and name;
  the limits the module checks are the header's.
- A request refuses a tensor that is not on a CUDA device, or not contiguous, when it is built; a
  CUDA primitive on a host request gets the library's own message without importing torch.

Torch's own tensors are checked when torch imports (CPU tensors suffice); --require-torch makes a
missing torch a failure (scripts/checks/wheel-check.sh passes it with scripts/test.sh's torch
venv). Exits non-zero on any failure.
"""

import gc
import os
import re
import sys

import nvfuser_ipc as nv

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from store_bridge import DictStore  # noqa: E402  (a torch.distributed.Store over a dict)

INVALID_ARGUMENT, INVALID_STATE = 1, 9


def expect(exc_type, fn, *needles):
    """Calls fn, which must raise exc_type with every needle in its message; returns it."""
    try:
        fn()
    except exc_type as e:
        for needle in needles:
            assert needle in str(e), f"{str(e)!r} lacks {needle!r}"
        return e
    raise AssertionError(f"no {exc_type.__name__} raised (expected one saying {needles})")


def invalid(fn, *needles):
    e = expect(nv.NvfipcInvalidArgument, fn, *needles)
    assert isinstance(e, ValueError), type(e).__mro__
    assert (e.status, e.status_name) == (INVALID_ARGUMENT, "invalid argument"), e
    return e


def check_host_buffer_views() -> None:
    buf = nv.HostBuffer(4096)
    view = buf.view()
    view[:3] = b"abc"
    expect(BufferError, buf.free, "cannot free HostBuffer(4096 bytes", "1 view(s)")
    assert bytes(view[:3]) == b"abc", "the refused free() changed the buffer"
    part = view[1:]
    view.release()
    expect(BufferError, buf.free, "1 view(s)")  # a slice keeps the memory too
    assert bytes(part[:2]) == b"bc"
    del part
    with buf.view() as v:
        assert bytes(v[:3]) == b"abc"
    address = buf.ptr
    buf.free()
    buf.free()  # a freed buffer is left as it is
    e = expect(nv.NvfipcError, buf.view, "HostBuffer.view", "is freed", f"was at {address:#x}")
    assert (e.status, e.status_name) == (INVALID_STATE, "invalid state"), e
    e = expect(nv.NvfipcError, lambda: nv.Request(0, nv.SEND, "t", buf), "is freed")
    assert e.status == INVALID_STATE, e

    # A view kept alive only by a reference cycle does not block the free.
    cyclic = nv.HostBuffer(64)

    class Holder:
        pass

    holder = Holder()
    holder.me, holder.view = holder, cyclic.view()
    del holder
    cyclic.free()


def check_integer_ranges(ctx: nv.Context, cache: nv.Cache) -> None:
    host = nv.HostBuffer(64)
    req = nv.Request(0, nv.RECV, "ranges", host)
    huge = 2**64 + 1
    invalid(lambda: nv.Request(huge, nv.SEND, "t", host), f"peer = {huge} is out of range")
    invalid(lambda: nv.Request(-1, nv.SEND, "t", host), "peer = -1")
    invalid(lambda: nv.Request(131072, nv.SEND, "t", host), "peer = 131072",
            "NVFIPC_MAX_WORLD_SIZE = 131072")
    invalid(lambda: nv.Request(0, 2**32 + 1, "t", host), "direction = 4294967297")
    invalid(lambda: nv.Request(0, nv.SEND, "a\0b", host), "no NUL character")
    invalid(lambda: nv.Request(0, nv.SEND, "x" * 8193, host), "tag (8193 bytes)",
            "NVFIPC_MAX_STRING_LEN = 8192")
    nv.Request(0, nv.SEND, "x" * 8192, host)  # the limit itself is a tag
    invalid(lambda: nv.HostBuffer(-1), "nbytes = -1")
    invalid(lambda: nv.HostBuffer(2**64), f"nbytes = {2**64}")
    invalid(lambda: cache.host_recv_post(req, nbytes=huge), f"nbytes = {huge}")
    invalid(lambda: cache.host_send_wait(req, timeout=-1), "timeout = -1")
    invalid(lambda: cache.host_send_wait(req, timeout=float("nan")), "timeout = nan")
    invalid(lambda: cache.exchange([req], timeout=float("inf")), "timeout = inf")
    assert nv._api._ms("t", 1e30) == 2**63 - 1, "a huge timeout is clamped, not wrapped"
    invalid(lambda: ctx.barrier([2**64], timeout=1), f"ranks[0] = {2**64}")
    invalid(lambda: nv.set_log_level(2**32 + 2), "level = 4294967298")
    invalid(lambda: nv.Context.connect(huge, 2, "127.0.0.1", 1), f"rank = {huge}")
    invalid(lambda: nv.Context.connect(0, 2, "127.0.0.1", 65537), "port = 65537")
    invalid(lambda: nv.Context.from_torch_store(DictStore(), 0, huge), f"world_size = {huge}")
    invalid(lambda: nv.Cache(ctx, scope="s\0"), "scope")
    expect(TypeError, lambda: nv.Request("1", nv.SEND, "t", host), "peer must be an integer")
    expect(TypeError, lambda: nv.Request(0, nv.SEND, b"t", host), "tag must be a str")
    expect(TypeError, lambda: nv.Request(0, nv.SEND, "t", bytearray(8)), "nv.HostBuffer")
    expect(TypeError, lambda: cache.host_send_wait(req, timeout="1"), "timeout must be")
    # The library's own refusals carry their status too.
    invalid(lambda: cache.exchange([nv.Request(0, nv.SEND, "self", host)]), "this rank")
    host.free()


class FakeTensor:
    """What a Request looks at in a torch.Tensor; its pointer must not be read when refused."""

    def __init__(self, cuda: bool, contiguous: bool) -> None:
        self.is_cuda, self.contiguous = cuda, contiguous
        self.device, self.shape = ("cuda:0" if cuda else "cpu"), (4, 4)

    def is_contiguous(self) -> bool:
        return self.contiguous

    def stride(self) -> tuple:
        return (1, 4)

    def data_ptr(self) -> int:
        raise AssertionError("the pointer of a refused tensor was read")

    def element_size(self) -> int:
        return 4

    def numel(self) -> int:
        return 16


def check_requests(cache: nv.Cache, require_torch: bool) -> None:
    invalid(lambda: nv.Request(0, nv.SEND, "t", FakeTensor(False, True)),
            "a tensor on cpu", "needs a CUDA tensor", "nv.HostBuffer")
    invalid(lambda: nv.Request(0, nv.SEND, "t", FakeTensor(True, False)),
            "non-contiguous tensor (shape (4, 4), strides (1, 4))", "contiguous()")
    # A CUDA primitive on a host request: the library's message, torch never imported.
    host = nv.HostBuffer(64)
    req = nv.Request(0, nv.SEND, "host", host)
    saved = sys.modules.get("torch")
    sys.modules["torch"] = None  # `import torch` now raises ImportError
    try:
        for post in (cache.cuda_send_post, cache.cuda_recv_post, cache.cuda_send_wait):
            invalid(lambda: post(req), "need a NVFIPC_MEM_DEVICE request")
    finally:
        del sys.modules["torch"]
        if saved is not None:
            sys.modules["torch"] = saved
    host.free()
    try:
        import torch
    except ImportError:
        assert not require_torch, "--require-torch: torch does not import"
        print("api misuse: torch not installed; its tensors were not checked")
        return
    invalid(lambda: nv.Request(0, nv.SEND, "t", torch.zeros(16)), "a tensor on cpu")
    invalid(lambda: nv.Request(0, nv.SEND, "t", torch.zeros(4, 4).t()), "a tensor on cpu")
    if torch.cuda.is_available():
        strided = torch.zeros(4, 4, device="cuda").t()
        invalid(lambda: nv.Request(0, nv.SEND, "t", strided), "non-contiguous")
        device_req = nv.Request(0, nv.SEND, "dev", torch.zeros(4, device="cuda"))
        invalid(lambda: cache.host_send_post(device_req), "need a NVFIPC_MEM_HOST request")
    print(f"api misuse: torch {torch.__version__} tensors checked")


def check_limits_match_the_header() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for header in (os.path.join(nv.include_dir(), "nvfuser_ipc.h"),
                   os.path.join(here, "..", "..", "include", "nvfuser_ipc.h")):
        if os.path.exists(header):
            break
    text = open(header).read()
    for name, value in (("NVFIPC_MAX_WORLD_SIZE", nv._api._MAX_WORLD_SIZE),
                        ("NVFIPC_MAX_STRING_LEN", nv._api._MAX_STRING_LEN)):
        found = re.search(rf"#define {name} (\d+)", text)
        assert found and int(found.group(1)) == value, (header, name, value)
    for status, name in ((INVALID_ARGUMENT, "INVALID_ARGUMENT"), (INVALID_STATE, "INVALID_STATE"),
                         (nv._api._STATUS_TIMEOUT, "TIMEOUT")):
        assert re.search(rf"NVFIPC_STATUS_{name} = {status},", text), (header, name, status)


def main() -> int:
    require_torch = "--require-torch" in sys.argv[1:]
    check_limits_match_the_header()
    check_host_buffer_views()
    ctx = nv.Context.from_torch_store(DictStore(), 0, 1)
    cache = nv.Cache(ctx)
    check_integer_ranges(ctx, cache)
    check_requests(cache, require_torch)
    cache.close()
    for closed in (cache.counters, lambda: cache.exchange([])):
        e = expect(nv.NvfipcError, closed, "nv.Cache is closed")
        assert (e.status, e.status_name) == (INVALID_STATE, "invalid state"), e
    ctx.close()
    e = expect(nv.NvfipcError, lambda: ctx.rank, "nv.Context is closed")
    assert (e.status, e.status_name) == (INVALID_STATE, "invalid state"), e
    gc.collect()
    print("api misuse: views, integer ranges, statuses and requests all refused as they should be")
    return 0


if __name__ == "__main__":
    sys.exit(main())
