"""The Python API over the C ABI (``include/nvfuser_ipc.h``), through ctypes.

Every call that fails raises :class:`NvfipcError` with the library's status and message. The
library is loaded on first use from :func:`nvfuser_ipc.library_path`. Calls into the library
release the GIL (ctypes.CDLL), so other Python threads run while an exchange or barrier waits.
Every integer is checked against its range before it reaches ctypes, which would wrap it silently
(peer ``2**64 + 1`` would become peer 1): a value out of range raises
:class:`NvfipcInvalidArgument` (a ``ValueError``) naming it, a value of the wrong type
``TypeError``.
"""

from __future__ import annotations

import ctypes
import gc
import math
import numbers
import operator
import threading
import weakref
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    byref,
    c_bool,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ._paths import library_path

SEND = 0
"""``NVFIPC_DIRECTION_SEND``: this rank's buffer, read by the peer."""
RECV = 1
"""``NVFIPC_DIRECTION_RECV``: the peer's buffer, mapped here."""
MEM_DEVICE = 0
MEM_HOST = 1
LOG_OFF, LOG_WARN, LOG_INFO, LOG_DEBUG, LOG_TRACE = range(5)

# nvfipc_status values (the header's enum) that the Python side raises itself.
_STATUS_INVALID_ARGUMENT = 1
_STATUS_TIMEOUT = 2
_STATUS_INVALID_STATE = 9

# The header's limits (NVFIPC_MAX_WORLD_SIZE, NVFIPC_MAX_STRING_LEN) and the C integer ranges.
_MAX_WORLD_SIZE = 131072
_MAX_STRING_LEN = 8192
_I32 = (-(1 << 31), (1 << 31) - 1)
_I64_MAX = (1 << 63) - 1
_U64_MAX = (1 << 64) - 1


class NvfipcError(RuntimeError):
    """A failed library call: ``status`` (the ``nvfipc_status`` value), ``status_name`` and the
    library's message (what failed, for which rank, peer, key or timeout, and what to do)."""

    def __init__(self, call: str, status: int, status_name: str, message: str) -> None:
        super().__init__(f"{status_name}: {message}" if message else f"{call}: {status_name}")
        self.call = call
        self.status = status
        self.status_name = status_name
        self.message = message


class NvfipcTimeout(NvfipcError):
    """``NVFIPC_STATUS_TIMEOUT``: a peer did not arrive in time (the message names it)."""


class NvfipcInvalidArgument(NvfipcError, ValueError):
    """``NVFIPC_STATUS_INVALID_ARGUMENT``: an argument out of range or unusable, refused by the
    library or, before it reaches ctypes, by this module (the message names the argument, its
    value and what it must be). Also a ``ValueError``."""


# ---- C structures (the header's, field for field) ----


class _Request(Structure):
    _fields_ = [
        ("peer", c_int64),
        ("direction", c_int32),
        ("kind", c_int32),
        ("tag", c_char_p),
        ("ptr", c_uint64),
        ("bytes", c_uint64),
    ]


class _P2pHandle(Structure):
    _fields_ = [
        ("local_ptr", c_uint64),
        ("local_bytes", c_uint64),
        ("local_semaphore", c_uint64),
        ("peer_ptr", c_uint64),
        ("peer_bytes", c_uint64),
        ("peer_semaphore", c_uint64),
        ("kind", c_int32),
    ]


_CACHE_COUNTERS = [
    "exchanges", "hits", "misses", "store_round_trips", "records_sent", "record_bytes_sent",
    "records_received", "opens", "closes", "keys_deleted", "peers_unclosed", "leaked_slabs",
    "peer_lookups", "records_known",
]
_VMM_COUNTERS = [
    "segment_exports", "segment_imports", "segment_releases", "maps", "unmaps", "live_segments",
    "live_maps", "pool_imports", "pool_frees", "inside_mapped",
]
_IPC_COUNTERS = ["opens", "closes", "live", "pending_closes", "close_errors"]


def _counters(names: List[str]) -> type:
    return type("_Counters", (Structure,), {"_fields_": [(n, c_uint64) for n in names]})


_CacheCounters = _counters(_CACHE_COUNTERS)
_VmmCounters = _counters(_VMM_COUNTERS)
_IpcCounters = _counters(_IPC_COUNTERS)

_LogFn = CFUNCTYPE(None, c_int32, c_char_p, c_char_p, c_void_p)

_KEY = POINTER(ctypes.c_char)
_OUT_BYTES = POINTER(POINTER(c_uint8))
_SetFn = CFUNCTYPE(c_int, c_void_p, _KEY, c_size_t, POINTER(c_uint8), c_size_t)
_GetFn = CFUNCTYPE(c_int, c_void_p, _KEY, c_size_t, c_int64, _OUT_BYTES, POINTER(c_size_t))
_AddFn = CFUNCTYPE(c_int, c_void_p, _KEY, c_size_t, c_int64, POINTER(c_int64))
_CheckFn = CFUNCTYPE(c_int, c_void_p, POINTER(_KEY), POINTER(c_size_t), c_size_t, POINTER(c_bool))
_DeleteFn = CFUNCTYPE(c_int, c_void_p, _KEY, c_size_t, POINTER(c_bool))
_WaitFn = CFUNCTYPE(c_int, c_void_p, POINTER(_KEY), POINTER(c_size_t), c_size_t, c_int64)
_CompareSetFn = CFUNCTYPE(c_int, c_void_p, _KEY, c_size_t, POINTER(c_uint8), c_size_t,
                          POINTER(c_uint8), c_size_t, _OUT_BYTES, POINTER(c_size_t))
_NumKeysFn = CFUNCTYPE(c_int, c_void_p, POINTER(c_int64))
_ErrorFn = CFUNCTYPE(c_void_p, c_void_p)


class _StoreCallbacks(Structure):
    _fields_ = [
        ("ctx", c_void_p),
        ("set", _SetFn),
        ("get", _GetFn),
        ("add", _AddFn),
        ("check", _CheckFn),
        ("delete_key", _DeleteFn),
        ("wait", _WaitFn),
        ("compare_set", _CompareSetFn),
        ("append", c_void_p),
        ("num_keys", _NumKeysFn),
        ("multi_set", c_void_p),
        ("multi_get", c_void_p),
        ("free_value", c_void_p),
        ("error_message", _ErrorFn),
    ]


# ---- loading ----

_lib_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None


def _load() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        lib = ctypes.CDLL(library_path())
        st = c_int
        sigs: Dict[str, tuple] = {
            "nvfipc_last_error_message": ([], c_char_p),
            "nvfipc_status_name": ([c_int32], c_char_p),
            "nvfipc_version": ([], c_char_p),
            "nvfipc_context_from_env": ([POINTER(c_void_p)], st),
            "nvfipc_context_create": ([c_int64, c_int64, c_int64, c_int64, c_void_p,
                                       POINTER(c_void_p)], st),
            "nvfipc_context_connect": ([c_int64, c_int64, c_char_p, c_uint16, c_bool, c_int64,
                                        POINTER(c_void_p)], st),
            "nvfipc_context_rank": ([c_void_p, POINTER(c_int64)], st),
            "nvfipc_context_world_size": ([c_void_p, POINTER(c_int64)], st),
            "nvfipc_context_local_rank": ([c_void_p, POINTER(c_int64)], st),
            "nvfipc_context_local_world_size": ([c_void_p, POINTER(c_int64)], st),
            "nvfipc_context_job_id": ([c_void_p, POINTER(c_char_p)], st),
            "nvfipc_context_free": ([c_void_p], st),
            "nvfipc_barrier": ([c_void_p, POINTER(c_int64), c_size_t, c_int64], st),
            "nvfipc_store_from_callbacks": ([POINTER(_StoreCallbacks), POINTER(c_void_p)], st),
            "nvfipc_store_free": ([c_void_p], st),
            "nvfipc_store_set_server_address": ([c_void_p, c_char_p, c_uint16], st),
            "nvfipc_cache_create": ([c_void_p, POINTER(c_void_p)], st),
            "nvfipc_cache_create_scoped": ([c_void_p, c_char_p, POINTER(c_void_p)], st),
            "nvfipc_cache_free": ([c_void_p], st),
            "nvfipc_exchange_handles_timeout": ([c_void_p, POINTER(_Request), c_size_t,
                                                 c_int64], st),
            "nvfipc_cache_get": ([c_void_p, POINTER(_Request), POINTER(_P2pHandle)], st),
            "nvfipc_cache_stats": ([c_void_p, POINTER(_CacheCounters)], st),
            "nvfipc_host_alloc": ([c_size_t, POINTER(c_void_p)], st),
            "nvfipc_host_free": ([c_void_p], st),
            "nvfipc_host_p2p_send_post": ([c_void_p, POINTER(_Request)], st),
            "nvfipc_host_p2p_recv_post": ([c_void_p, POINTER(_Request), c_uint64, c_int64], st),
            "nvfipc_host_p2p_send_wait": ([c_void_p, POINTER(_Request), c_int64], st),
            "nvfipc_cuda_p2p_send_post": ([c_void_p, POINTER(_Request), c_void_p], st),
            "nvfipc_cuda_p2p_recv_post": ([c_void_p, POINTER(_Request), c_uint64, c_void_p], st),
            "nvfipc_cuda_p2p_send_wait": ([c_void_p, POINTER(_Request), c_void_p], st),
            "nvfipc_cuda_available": ([POINTER(c_bool)], st),
            "nvfipc_cuda_vmm_counters_get": ([POINTER(_VmmCounters)], st),
            "nvfipc_cuda_ipc_counters_get": ([POINTER(_IpcCounters)], st),
            "nvfipc_log_set_level": ([c_int32], st),
            "nvfipc_log_get_level": ([POINTER(c_int32)], st),
            "nvfipc_log_set_callback": ([_LogFn, c_void_p], st),
        }
        for name, (args, res) in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = res
        _lib = lib
        return lib


def _error(call: str, status: int, message: str) -> NvfipcError:
    """The exception of ``status`` (its name as the library gives it) for ``call``."""
    name = (_load().nvfipc_status_name(status) or b"?").decode()
    classes = {_STATUS_TIMEOUT: NvfipcTimeout, _STATUS_INVALID_ARGUMENT: NvfipcInvalidArgument}
    return classes.get(status, NvfipcError)(call, status, name, message)


def _invalid(call: str, message: str) -> NvfipcError:
    return _error(call, _STATUS_INVALID_ARGUMENT, f"{call}: {message}")


def _check(status: int, call: str) -> None:
    if status == 0:
        return
    message = (_load().nvfipc_last_error_message() or b"").decode(errors="replace")
    raise _error(call, status, message)


def _int(call: str, name: str, value: Any, lo: int, hi: int, meaning: str = "") -> int:
    """``value`` as an int in ``lo..hi`` (checked here: ctypes would wrap it silently)."""
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{call}: {name} must be an integer, not {type(value).__name__}") from None
    if not lo <= v <= hi:
        raise _invalid(call, f"{name} = {v} is out of range: expected {lo}..{hi}{meaning}")
    return v


def _rank(call: str, name: str, value: Any) -> int:
    return _int(call, name, value, 0, _MAX_WORLD_SIZE - 1,
                f" (a rank; a world has at most NVFIPC_MAX_WORLD_SIZE = {_MAX_WORLD_SIZE})")


def _c_str(call: str, name: str, value: Any) -> bytes:
    """A string argument as the C API takes it: UTF-8, no NUL, at most NVFIPC_MAX_STRING_LEN."""
    if not isinstance(value, str):
        raise TypeError(f"{call}: {name} must be a str, not {type(value).__name__}")
    data = value.encode(errors="surrogatepass")
    if b"\0" in data or len(data) > _MAX_STRING_LEN:
        raise _invalid(call, f"{name} ({len(data)} bytes) must hold no NUL character and at most "
                             f"NVFIPC_MAX_STRING_LEN = {_MAX_STRING_LEN} bytes")
    return data


def _call(name: str, *args: Any) -> None:
    _check(getattr(_load(), name)(*args), name)


def version() -> str:
    """The C library's version."""
    return _load().nvfipc_version().decode()


def _ms(call: str, timeout: Optional[Union[float, timedelta]]) -> int:
    """Seconds (or a timedelta) to the C API's milliseconds; None: the default (-1); 0 checks
    once without waiting."""
    if timeout is None:
        return -1
    seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
        raise TypeError(f"{call}: timeout must be a number of seconds, a timedelta or None, not "
                        f"{type(timeout).__name__}")
    if not (0 <= seconds and math.isfinite(seconds)):  # NaN fails both
        raise _invalid(call, f"timeout = {timeout!r} must be a finite number of seconds >= 0, "
                             f"or None for the default")
    return min(int(seconds * 1000), _I64_MAX)


# ---- the log hook ----

_log_hook: Optional[Any] = None  # keeps the C callback alive


def set_log_level(level: int) -> None:
    """Sets the most verbose level logged (``LOG_OFF`` .. ``LOG_TRACE``), overriding
    ``NVFIPC_DEBUG``."""
    _call("nvfipc_log_set_level", _int("set_log_level", "level", level, *_I32))


def set_log_callback(callback: Optional[Callable[[int, str, str], None]]) -> None:
    """Sends every log line to ``callback(level, subsystem, line)`` instead of stderr (None
    restores stderr). The callback runs on the library's threads too; exceptions it raises are
    printed and dropped."""
    global _log_hook
    if callback is None:
        _call("nvfipc_log_set_callback", ctypes.cast(None, _LogFn), None)
        _log_hook = None
        return

    def hook(level: int, subsystem: bytes, line: bytes, _user: Any) -> None:
        try:
            callback(level, subsystem.decode(errors="replace"), line.decode(errors="replace"))
        except Exception as e:  # never unwind into the library
            print(f"nvfuser_ipc log callback raised {e!r}")

    c_hook = _LogFn(hook)
    _call("nvfipc_log_set_callback", c_hook, None)
    _log_hook = c_hook


# ---- stores ----

_libc = ctypes.CDLL(None)
_libc.malloc.argtypes = [c_size_t]
_libc.malloc.restype = c_void_p


def _tcp_server_address(store: Any) -> Optional[Tuple[str, int]]:
    """Where the ``TCPStore`` under ``store`` (through ``PrefixStore``s) listens, as its client
    connects to it, or None for other stores. With it the library sees, without a request,
    whether the server is still there when a rank closes, and the rank whose process runs it
    keeps it until the others have closed (``nvfipc_store_set_server_address``)."""
    for _ in range(16):  # a chain of PrefixStores, never a cycle
        host, port = getattr(store, "host", None), getattr(store, "port", None)
        if isinstance(host, str) and host and isinstance(port, int) and 0 < port < 65536:
            return host, port
        store = getattr(store, "underlying_store", None)
        if store is None:
            return None
    return None


class _TorchStoreBridge:
    """The ``nvfipc_store_callbacks`` of a ``torch.distributed.Store`` (TCPStore, FileStore,
    PrefixStore, ...): the library's keys and values go through the torch store."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.error = threading.local()
        self.callbacks = _StoreCallbacks(
            None,
            _SetFn(self._set), _GetFn(self._get), _AddFn(self._add), _CheckFn(self._check),
            _DeleteFn(self._delete), _WaitFn(self._wait), _CompareSetFn(self._compare_set),
            None, _NumKeysFn(self._num_keys), None, None, None, _ErrorFn(self._error_message),
        )

    # Every callback returns 0, 2 (timeout) or 1 (failure, described by error_message).
    def _guard(self, fn: Callable[[], None]) -> int:
        try:
            fn()
            return 0
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            self.error.message = ctypes.create_string_buffer(text.encode(errors="replace"))
            return _STATUS_TIMEOUT if "timeout" in text.lower() or "timed out" in text else 1

    def _error_message(self, _ctx: Any) -> Optional[int]:
        buf = getattr(self.error, "message", None)
        return ctypes.addressof(buf) if buf is not None else None

    @staticmethod
    def _key(key: Any, n: int) -> str:
        return ctypes.string_at(key, n).decode()

    @staticmethod
    def _out(value: bytes, out_value: Any, out_len: Any) -> None:
        if value:
            ptr = _libc.malloc(len(value))
            if not ptr:
                raise MemoryError("malloc")
            ctypes.memmove(ptr, value, len(value))
            out_value[0] = ctypes.cast(ptr, POINTER(c_uint8))
        else:
            out_value[0] = ctypes.cast(None, POINTER(c_uint8))
        out_len[0] = len(value)

    def _keys(self, keys: Any, lens: Any, n: int) -> List[str]:
        return [self._key(keys[i], lens[i]) for i in range(n)]

    def _set(self, _c: Any, key: Any, klen: int, value: Any, vlen: int) -> int:
        return self._guard(lambda: self.store.set(self._key(key, klen),
                                                  ctypes.string_at(value, vlen)))

    def _get(self, _c: Any, key: Any, klen: int, timeout_ms: int, out: Any, out_len: Any) -> int:
        def run() -> None:
            k = self._key(key, klen)
            if timeout_ms == 0:
                if not self.store.check([k]):
                    raise TimeoutError(f"key {k!r} is not set")
            else:
                self.store.wait([k], timedelta(milliseconds=max(timeout_ms, 1)))
            self._out(bytes(self.store.get(k)), out, out_len)
        return self._guard(run)

    def _add(self, _c: Any, key: Any, klen: int, delta: int, out: Any) -> int:
        def run() -> None:
            out[0] = int(self.store.add(self._key(key, klen), delta))
        return self._guard(run)

    def _check(self, _c: Any, keys: Any, lens: Any, n: int, out: Any) -> int:
        def run() -> None:
            out[0] = bool(self.store.check(self._keys(keys, lens, n)))
        return self._guard(run)

    def _delete(self, _c: Any, key: Any, klen: int, out: Any) -> int:
        def run() -> None:
            out[0] = bool(self.store.delete_key(self._key(key, klen)))
        return self._guard(run)

    def _wait(self, _c: Any, keys: Any, lens: Any, n: int, timeout_ms: int) -> int:
        def run() -> None:
            ks = self._keys(keys, lens, n)
            if timeout_ms == 0:
                if not self.store.check(ks):
                    raise TimeoutError(f"keys {ks!r} are not all set")
            else:
                self.store.wait(ks, timedelta(milliseconds=max(timeout_ms, 1)))
        return self._guard(run)

    def _compare_set(self, _c: Any, key: Any, klen: int, exp: Any, elen: int, des: Any,
                     dlen: int, out: Any, out_len: Any) -> int:
        def run() -> None:
            value = self.store.compare_set(self._key(key, klen), ctypes.string_at(exp, elen),
                                           ctypes.string_at(des, dlen))
            self._out(bytes(value), out, out_len)
        return self._guard(run)

    def _num_keys(self, _c: Any, out: Any) -> int:
        def run() -> None:
            out[0] = int(self.store.num_keys())
        return self._guard(run)


# ---- context ----


class Context:
    """Who this process is in the job (rank, world size, local rank) and the store the ranks
    share. Make one with :meth:`from_env` (mpirun, torchrun, srun, ``nvfipc launch``),
    :meth:`from_torch_store` (a ``torch.distributed`` store) or :meth:`connect`; close it with
    :meth:`close` or a ``with`` block."""

    def __init__(self, handle: int, keep: Any = None) -> None:
        self._handle: Optional[int] = handle
        self._keep = keep  # the torch store bridge, alive as long as the context

    @classmethod
    def from_env(cls) -> "Context":
        """The context of the launcher's environment (see the README's Environment table)."""
        out = c_void_p()
        _call("nvfipc_context_from_env", byref(out))
        return cls(out.value)

    @classmethod
    def connect(cls, rank: int, world_size: int, host: str, port: int, host_store: bool = False,
                timeout: Optional[float] = None) -> "Context":
        """The context of ``rank`` of ``world_size`` (one node) over the TCPStore at
        ``host:port``; ``host_store`` starts the store server in this process (port 0: any)."""
        call = "Context.connect"
        args = (_rank(call, "rank", rank), _int(call, "world_size", world_size, 1, _MAX_WORLD_SIZE),
                _c_str(call, "host", host), _int(call, "port", port, 0, 65535), bool(host_store),
                _ms(call, timeout))
        out = c_void_p()
        _call("nvfipc_context_connect", *args, byref(out))
        return cls(out.value)

    @classmethod
    def from_torch_store(cls, store: Any, rank: int, world_size: int,
                         local_rank: Optional[int] = None,
                         local_world_size: Optional[int] = None) -> "Context":
        """The context of ``rank`` of ``world_size`` over a ``torch.distributed.Store`` (e.g.
        ``torch.distributed.distributed_c10d._get_default_store()``, or a ``TCPStore``). The
        local rank and size default to the rank and world size (one node)."""
        call = "Context.from_torch_store"
        rank = _rank(call, "rank", rank)
        world_size = _int(call, "world_size", world_size, 1, _MAX_WORLD_SIZE)
        local_rank = rank if local_rank is None else _rank(call, "local_rank", local_rank)
        local_world_size = (world_size if local_world_size is None else
                            _int(call, "local_world_size", local_world_size, 1, _MAX_WORLD_SIZE))
        bridge = _TorchStoreBridge(store)
        st = c_void_p()
        _call("nvfipc_store_from_callbacks", byref(bridge.callbacks), byref(st))
        out = c_void_p()
        try:
            address = _tcp_server_address(store)
            if address is not None:
                _call("nvfipc_store_set_server_address", st, address[0].encode(), address[1])
            _call("nvfipc_context_create", rank, world_size, local_rank, local_world_size, st,
                  byref(out))
        finally:
            _call("nvfipc_store_free", st)
        return cls(out.value, keep=bridge)

    def _h(self) -> int:
        if self._handle is None:
            raise _error("Context", _STATUS_INVALID_STATE,
                         "this nv.Context is closed (close() or its with block); make a new one")
        return self._handle

    def _int(self, name: str) -> int:
        v = c_int64()
        _call(name, self._h(), byref(v))
        return v.value

    @property
    def rank(self) -> int:
        return self._int("nvfipc_context_rank")

    @property
    def world_size(self) -> int:
        return self._int("nvfipc_context_world_size")

    @property
    def local_rank(self) -> int:
        return self._int("nvfipc_context_local_rank")

    @property
    def local_world_size(self) -> int:
        return self._int("nvfipc_context_local_world_size")

    @property
    def job_id(self) -> str:
        v = c_char_p()
        _call("nvfipc_context_job_id", self._h(), byref(v))
        return (v.value or b"").decode()

    def barrier(self, ranks: Optional[Sequence[int]] = None,
                timeout: Optional[float] = None) -> None:
        """Waits until every rank of ``ranks`` (default: the world) has entered the same
        barrier; ``timeout`` in seconds (default: the context's)."""
        members = [_rank("Context.barrier", f"ranks[{i}]", r) for i, r in enumerate(ranks or [])]
        arr = (c_int64 * len(members))(*members) if members else None
        _call("nvfipc_barrier", self._h(), arr, len(members), _ms("Context.barrier", timeout))

    def close(self) -> None:
        """Closes the context (the rank hosting the store waits, bounded, for the others)."""
        if self._handle is not None:
            h, self._handle = self._handle, None
            _call("nvfipc_context_free", h)

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            try:
                self.close()
            except Exception:
                pass


# ---- buffers ----


class HostBuffer:
    """Host memory that peers can map (``nvfipc_host_alloc``: an anonymous shared file passed
    by descriptor), zero-filled; ``view()`` is a writable memoryview of it. As ``mmap.close()``,
    :meth:`free` refuses with ``BufferError`` while views of it exist, so no view outlives the
    memory it shows."""

    def __init__(self, nbytes: int) -> None:
        nbytes = _int("HostBuffer", "nbytes", nbytes, 0, _U64_MAX)
        ptr = c_void_p()
        _call("nvfipc_host_alloc", nbytes, byref(ptr))
        self.ptr: int = ptr.value or 0
        self.nbytes = nbytes
        self._address = self.ptr
        # Each view exports its own instance of this type; a weak reference to each tells which
        # are still alive (a memoryview keeps its exporter alive until it is released).
        self._type = type("HostBytes", (ctypes.c_ubyte * nbytes,), {})
        self._exports: List[weakref.ref] = []

    def __repr__(self) -> str:
        where = f"at {self.ptr:#x}" if self.ptr else f"freed, was at {self._address:#x}"
        return f"HostBuffer({self.nbytes} bytes, {where})"

    def _live(self, call: str) -> int:
        """The address, or the library's INVALID_STATE error once freed."""
        if not self.ptr:
            raise _error(call, _STATUS_INVALID_STATE, f"{call}: {self!r} is freed; allocate a new "
                                                      f"nv.HostBuffer")
        return self.ptr

    def view(self) -> memoryview:
        """A writable memoryview of the buffer. Release it (``view.release()``, or ``with
        buf.view() as v:``) or drop it before :meth:`free`."""
        exporter = self._type.from_address(self._live("HostBuffer.view"))
        self._exports = [r for r in self._exports if r() is not None]
        self._exports.append(weakref.ref(exporter))
        return memoryview(exporter).cast("B")

    def _views(self) -> int:
        return sum(r() is not None for r in self._exports)

    def free(self) -> None:
        """Frees the buffer (peers that mapped it keep their mapping); a freed buffer is left
        as it is. ``BufferError`` while a view of it exists (nothing is freed then)."""
        if not self.ptr:
            return
        if self._views():
            gc.collect()  # views only kept alive by reference cycles
        views = self._views()
        if views:
            raise BufferError(f"cannot free {self!r}: {views} view(s) of it still exist; release "
                              f"them (view.release(), or `with buf.view() as v:`) first")
        p, self.ptr = self.ptr, 0
        _call("nvfipc_host_free", c_void_p(p))


class _CudaArray:
    """A device range as ``__cuda_array_interface__`` (bytes), for torch.as_tensor."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
            "strides": None,
        }


Buffer = Union[HostBuffer, Any]
"""A :class:`HostBuffer`, or a contiguous CUDA ``torch.Tensor``."""


@dataclass
class Request:
    """One communication of a batch: with ``peer``, ``SEND`` (this rank's buffer, which the
    peer maps) or ``RECV`` (the peer's buffer, mapped here); ``tag`` is equal on both sides."""

    peer: int
    direction: int
    tag: str
    buffer: Buffer

    def __post_init__(self) -> None:
        self._c()  # refuses a bad peer, direction, tag or buffer (device, layout) here

    def _c(self) -> _Request:
        call = f"Request(peer={self.peer!r}, tag={str(self.tag)[:64]!r})"
        peer = _rank(call, "peer", self.peer)
        direction = _int(call, "direction", self.direction, SEND, RECV, " (nv.SEND or nv.RECV)")
        tag = _c_str(call, "tag", self.tag)
        t = self.buffer
        if isinstance(t, HostBuffer):
            return _Request(peer, direction, MEM_HOST, tag, t._live(call), t.nbytes)
        if not all(hasattr(t, a) for a in ("data_ptr", "is_contiguous", "element_size")):
            raise TypeError(f"{call}: buffer must be an nv.HostBuffer or a torch.Tensor on a CUDA "
                            f"device, not {type(t).__name__}")
        if not getattr(t, "is_cuda", False):
            raise _invalid(call, f"buffer is a tensor on {getattr(t, 'device', '?')}: a device "
                                 f"request needs a CUDA tensor (host memory: nv.HostBuffer)")
        if not t.is_contiguous():
            raise _invalid(call, f"buffer is a non-contiguous tensor (shape {tuple(t.shape)}, "
                                 f"strides {t.stride()}): pass t.contiguous()")
        nbytes = t.numel() * t.element_size()
        return _Request(peer, direction, MEM_DEVICE, tag, t.data_ptr(), nbytes)


@dataclass
class Mapped:
    """What an exchange gives for one request: the peer's buffer as mapped here (a torch tensor
    shaped as the local one for device requests, a memoryview for host requests), its address
    and size, and the raw handles."""

    request: Request
    peer_ptr: int
    peer_bytes: int
    local_semaphore: int
    peer_semaphore: int
    peer: Any


class Cache:
    """The handle cache of a context: exchanges of request batches, cached, so that an exchange
    of unchanged buffers costs no store traffic. Close with :meth:`close` (waits, bounded, for
    the peers to close theirs) or a ``with`` block."""

    def __init__(self, ctx: Context, scope: Optional[str] = None) -> None:
        out = c_void_p()
        if scope is None:
            _call("nvfipc_cache_create", ctx._h(), byref(out))
        else:
            scope_arg = _c_str("Cache", "scope", scope)
            _call("nvfipc_cache_create_scoped", ctx._h(), scope_arg, byref(out))
        self._handle: Optional[int] = out.value
        self._ctx = ctx

    def _h(self) -> int:
        if self._handle is None:
            raise _error("Cache", _STATUS_INVALID_STATE,
                         "this nv.Cache is closed (close() or its with block); make a new one")
        return self._handle

    def exchange(self, requests: Sequence[Request],
                 timeout: Optional[float] = None) -> List[Mapped]:
        """Exchanges the batch with every peer it names (each makes the matching call) and
        returns, per request, the peer's buffer mapped here. ``timeout`` in seconds (default:
        the context's); on :class:`NvfipcTimeout` the same call can be retried."""
        reqs = [r._c() for r in requests]
        arr = (_Request * len(reqs))(*reqs)
        _call("nvfipc_exchange_handles_timeout", self._h(), arr, len(reqs),
              _ms("Cache.exchange", timeout))
        out = []
        for req, c in zip(requests, arr):
            h = _P2pHandle()
            _call("nvfipc_cache_get", self._h(), byref(c), byref(h))
            out.append(Mapped(req, h.peer_ptr, h.peer_bytes, h.local_semaphore,
                              h.peer_semaphore, self._peer_view(req, h)))
        return out

    @staticmethod
    def _peer_view(req: Request, h: _P2pHandle) -> Any:
        if h.kind == MEM_HOST:
            if not h.peer_ptr:
                return None
            return memoryview((ctypes.c_ubyte * h.peer_bytes).from_address(h.peer_ptr)).cast("B")
        import torch  # device requests come with torch tensors

        local = req.buffer
        raw = torch.as_tensor(_CudaArray(h.peer_ptr, h.peer_bytes), device=local.device)
        if h.peer_bytes == local.numel() * local.element_size():
            return raw.view(local.dtype).view(local.shape)
        return raw

    # Host transfers (RECV pulls the peer's bytes into the local buffer).
    def host_send_post(self, request: Request) -> None:
        """Tells the receiver that the send buffer holds the next transfer's data."""
        _call("nvfipc_host_p2p_send_post", self._h(), byref(request._c()))

    def host_recv_post(self, request: Request, nbytes: Optional[int] = None,
                       timeout: Optional[float] = None) -> None:
        """Waits for the sender's post, copies its buffer into the local one, signals it."""
        c, call = request._c(), "Cache.host_recv_post"
        _call("nvfipc_host_p2p_recv_post", self._h(), byref(c), _nbytes(call, c, nbytes),
              _ms(call, timeout))

    def host_send_wait(self, request: Request, timeout: Optional[float] = None) -> None:
        """Waits until the receiver has copied the last posted transfer."""
        _call("nvfipc_host_p2p_send_wait", self._h(), byref(request._c()),
              _ms("Cache.host_send_wait", timeout))

    # Device transfers, enqueued on a CUDA stream (default: torch's current stream).
    def cuda_send_post(self, request: Request, stream: Optional[Any] = None) -> None:
        c = request._c()
        _call("nvfipc_cuda_p2p_send_post", self._h(), byref(c),
              _stream("Cache.cuda_send_post", c, stream))

    def cuda_recv_post(self, request: Request, nbytes: Optional[int] = None,
                       stream: Optional[Any] = None) -> None:
        c, call = request._c(), "Cache.cuda_recv_post"
        _call("nvfipc_cuda_p2p_recv_post", self._h(), byref(c), _nbytes(call, c, nbytes),
              _stream(call, c, stream))

    def cuda_send_wait(self, request: Request, stream: Optional[Any] = None) -> None:
        c = request._c()
        _call("nvfipc_cuda_p2p_send_wait", self._h(), byref(c),
              _stream("Cache.cuda_send_wait", c, stream))

    def counters(self) -> Dict[str, int]:
        """The cache's counters (exchanges, hits, misses, store round trips, opens, ...)."""
        c = _CacheCounters()
        _call("nvfipc_cache_stats", self._h(), byref(c))
        return {n: getattr(c, n) for n in _CACHE_COUNTERS}

    def close(self) -> None:
        if self._handle is not None:
            h, self._handle = self._handle, None
            _call("nvfipc_cache_free", h)

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _nbytes(call: str, c: _Request, nbytes: Optional[int]) -> int:
    """A transfer's byte count (default: the whole request)."""
    return c.bytes if nbytes is None else _int(call, "nbytes", nbytes, 0, _U64_MAX)


def _stream(call: str, c: _Request, stream: Optional[Any]) -> Optional[int]:
    """The stream of a device request (default: torch's current stream). A host request gets
    NULL without asking torch (which may have no GPU to look at): the library refuses it with
    its own message."""
    if c.kind != MEM_DEVICE:
        return None
    if stream is None:
        import torch

        stream = torch.cuda.current_stream()
    return _int(call, "stream", getattr(stream, "cuda_stream", stream), 0, _U64_MAX)


def cuda_available() -> bool:
    """Whether the CUDA driver could be loaded and initialised in this process."""
    v = c_bool()
    _call("nvfipc_cuda_available", byref(v))
    return bool(v.value)


def vmm_counters() -> Dict[str, int]:
    """The process's VMM counters (exports, imports, maps; imports == releases after a clean
    teardown)."""
    c = _VmmCounters()
    _call("nvfipc_cuda_vmm_counters_get", byref(c))
    return {n: getattr(c, n) for n in _VMM_COUNTERS}


def ipc_counters() -> Dict[str, int]:
    """The process's legacy CUDA IPC counters (opens, closes, live, ...)."""
    c = _IpcCounters()
    _call("nvfipc_cuda_ipc_counters_get", byref(c))
    return {n: getattr(c, n) for n in _IPC_COUNTERS}
