//! C ABI of the key-value store (`nvfipc_store`): making one (TCP client, host callbacks), every
//! [`Store`] operation on it, library-owned buffers, and the embedded server (`nvfipc_server`).

use super::args::{
    c_str_arg, c_str_array_arg, count_arg, optional_out_ptr, out_ptr, out_slice_arg, positive_arg,
    ref_arg, slice_arg, timeout_arg, Out, NVFIPC_MAX_KEYS,
};
use super::boundary::ffi_call;
use super::registry::{free_buffer, handle_ref, into_buffer, into_handle, take_handle, Handle};
use super::store_callbacks::{nvfipc_store_callbacks, CallbackStore};
use crate::error::{Error, Result, Status};
use crate::store::client::{ConnectOptions, TcpStore};
use crate::store::server::StoreServer;
use crate::store::{wire, Store, DEFAULT_TIMEOUT};
use std::ffi::c_char;
use std::fmt::Display;
use std::sync::Arc;
use std::time::Duration;

/// Longest value given to a store operation, in bytes: the longest a TCPStore server accepts.
pub const NVFIPC_MAX_VALUE_LEN: usize = 8_388_608;
const _: () = assert!(NVFIPC_MAX_VALUE_LEN == wire::MAX_VALUE_LEN);

/// A key-value store with the semantics of PyTorch's `c10d::Store`: a TCPStore client
/// (`nvfipc_store_connect`) or a store backed by host callbacks (`nvfipc_store_from_callbacks`).
///
/// Thread safety: all operations may be called from any number of threads at once. A TCP store
/// sends one request at a time over its connection, so a blocking `get`/`wait` on one thread
/// delays other threads' calls on the same store; connect one store per thread when several
/// threads need independent blocking waits. `nvfipc_store_free` must not race with calls on the
/// same store from other threads (such races are detected where possible, never relied upon).
#[derive(Clone)]
pub struct nvfipc_store {
    pub(crate) store: Arc<dyn Store>,
    // The same store again when it is a TCP client or calls host callbacks, for the operations
    // only those have.
    pub(crate) tcp: Option<Arc<TcpStore>>,
    pub(crate) callback: Option<Arc<CallbackStore>>,
}

impl Handle for nvfipc_store {}

/// An input byte span: `len` bytes at `data` (`data` may be NULL when `len` is 0).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvfipc_bytes {
    pub data: *const u8,
    pub len: usize,
}

/// A byte buffer allocated by the library: `len` bytes at `data`, followed by a NUL byte that is
/// not counted in `len` (so text values can be used as C strings). Release it with
/// `nvfipc_buffer_free(data, len)`, or arrays of them with `nvfipc_buffers_free`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvfipc_buffer {
    pub data: *mut u8,
    pub len: usize,
}

/// Borrows the store behind a C pointer (the argument is always named `store`).
fn store_arg(store: *const nvfipc_store) -> Result<Arc<dyn Store>> {
    Ok(handle_ref(store, "store")?.store)
}

/// The store and key arguments every keyed operation begins with.
fn store_key<'a>(s: *const nvfipc_store, key: *const c_char) -> Result<(Arc<dyn Store>, &'a str)> {
    Ok((store_arg(s)?, c_str_arg(key, "key")?))
}

/// How long a waiting operation may block. `timeout_ms == 0` ("do not wait") is answered here
/// with one CHECK, so that it means the same on every backend (a zero timeout handed to a store
/// may race the server's reply, or mean "forever" to a host store); when the keys exist, the
/// operation then runs with the store's default bound, which it will not need.
fn wait_bound(store: &dyn Store, keys: &[&str], timeout_ms: i64) -> Result<Duration> {
    if timeout_ms != 0 {
        return Ok(timeout_arg(timeout_ms, store.default_timeout()));
    }
    if store.check(keys)? {
        return Ok(store.default_timeout());
    }
    const SHOWN: usize = 8;
    let mut listed = keys
        .iter()
        .take(SHOWN)
        .map(|k| format!("'{k}'"))
        .collect::<Vec<_>>()
        .join(", ");
    if keys.len() > SHOWN {
        listed.push_str(&format!(" and {} more", keys.len() - SHOWN));
    }
    Err(Error::timeout(format!(
        "not every key of {listed} is set (timeout_ms = 0: checked once without waiting)"
    )))
}

/// Borrows a value argument of `len` bytes, at most `NVFIPC_MAX_VALUE_LEN`.
fn value_arg<'a>(ptr: *const u8, len: usize, name: impl Display) -> Result<&'a [u8]> {
    if len > NVFIPC_MAX_VALUE_LEN {
        return Err(Error::invalid(format!(
            "argument `{name}` has a length of {len} bytes, above the limit of \
             NVFIPC_MAX_VALUE_LEN = {NVFIPC_MAX_VALUE_LEN} bytes"
        )));
    }
    slice_arg(ptr, len, name)
}

/// Hands a value to C through the `(out_value, out_len)` pair.
fn write_buffer(value: Vec<u8>, out_value: Out<*mut u8>, out_len: Out<usize>) -> Result<()> {
    let (data, len) = into_buffer(value);
    out_value.write(data)?;
    out_len.write(len)
}

/// Sets `key` to the `value_len` bytes at `value`, replacing any previous value, and wakes
/// waiters of `key`.
#[no_mangle]
pub extern "C" fn nvfipc_store_set(
    store: *const nvfipc_store,
    key: *const c_char,
    value: *const u8,
    value_len: usize,
) -> Status {
    ffi_call("nvfipc_store_set", || {
        let (store, key) = store_key(store, key)?;
        store.set(key, value_arg(value, value_len, "value")?)
    })
}

/// Waits until `key` exists (at most `timeout_ms`; < 0: the store's default, 0: check once) and
/// returns a copy of its value in `*out_value` / `*out_len`; free it with `nvfipc_buffer_free`.
/// A missing key after the wait gives `NVFIPC_STATUS_TIMEOUT`.
#[no_mangle]
pub extern "C" fn nvfipc_store_get(
    store: *const nvfipc_store,
    key: *const c_char,
    timeout_ms: i64,
    out_value: *mut *mut u8,
    out_len: *mut usize,
) -> Status {
    ffi_call("nvfipc_store_get", || {
        let (store, key) = store_key(store, key)?;
        let out_value = out_ptr(out_value, "out_value")?;
        let out_len = out_ptr(out_len, "out_len")?;
        let timeout = wait_bound(&*store, &[key], timeout_ms)?;
        write_buffer(store.get(key, timeout)?, out_value, out_len)
    })
}

/// Adds `delta` to the decimal counter at `key` (a missing key counts as 0) and writes the new
/// value to `*out_value` (`out_value` may be NULL).
#[no_mangle]
pub extern "C" fn nvfipc_store_add(
    store: *const nvfipc_store,
    key: *const c_char,
    delta: i64,
    out_value: *mut i64,
) -> Status {
    ffi_call("nvfipc_store_add", || {
        let (store, key) = store_key(store, key)?;
        let out_value = optional_out_ptr(out_value, "out_value")?;
        out_value.write(store.add(key, delta)?)
    })
}

/// Writes to `*out_all_exist` whether every one of the `n_keys` keys exists. Never blocks.
#[no_mangle]
pub extern "C" fn nvfipc_store_check(
    store: *const nvfipc_store,
    keys: *const *const c_char,
    n_keys: usize,
    out_all_exist: *mut bool,
) -> Status {
    ffi_call("nvfipc_store_check", || {
        let store = store_arg(store)?;
        let keys = c_str_array_arg(keys, n_keys, "keys", "n_keys")?;
        let out = out_ptr(out_all_exist, "out_all_exist")?;
        // All of no keys exist; not every backend accepts an empty list.
        out.write(keys.is_empty() || store.check(&keys)?)
    })
}

/// Blocks until every one of the `n_keys` keys exists, or fails with `NVFIPC_STATUS_TIMEOUT`
/// after `timeout_ms` (< 0: the store's default, 0: check once).
#[no_mangle]
pub extern "C" fn nvfipc_store_wait(
    store: *const nvfipc_store,
    keys: *const *const c_char,
    n_keys: usize,
    timeout_ms: i64,
) -> Status {
    ffi_call("nvfipc_store_wait", || {
        let store = store_arg(store)?;
        let keys = c_str_array_arg(keys, n_keys, "keys", "n_keys")?;
        if keys.is_empty() {
            // Nothing to wait for; not every backend accepts an empty list.
            return Ok(());
        }
        if timeout_ms == 0 {
            // wait_bound has checked that every key exists.
            return wait_bound(&*store, &keys, 0).map(drop);
        }
        store.wait(&keys, timeout_arg(timeout_ms, store.default_timeout()))
    })
}

/// Deletes `key`; writes to `*out_deleted` (may be NULL) whether it existed.
#[no_mangle]
pub extern "C" fn nvfipc_store_delete_key(
    store: *const nvfipc_store,
    key: *const c_char,
    out_deleted: *mut bool,
) -> Status {
    ffi_call("nvfipc_store_delete_key", || {
        let (store, key) = store_key(store, key)?;
        let out = optional_out_ptr(out_deleted, "out_deleted")?;
        out.write(store.delete_key(key)?)
    })
}

/// Writes the number of keys in the store to `*out_num_keys` (internal keys included, as in
/// PyTorch).
#[no_mangle]
pub extern "C" fn nvfipc_store_num_keys(
    store: *const nvfipc_store,
    out_num_keys: *mut i64,
) -> Status {
    ffi_call("nvfipc_store_num_keys", || {
        let store = store_arg(store)?;
        let out = out_ptr(out_num_keys, "out_num_keys")?;
        out.write(store.num_keys()?)
    })
}

/// Compare-and-set with `c10d::Store::compareSet` semantics: when `key` holds `expected` (or is
/// missing and `expected` is empty) it is set to `desired`. The value the key holds afterwards
/// (or the current value when the comparison failed) is returned in `*out_value`/`*out_len`;
/// free it with `nvfipc_buffer_free`.
#[no_mangle]
pub extern "C" fn nvfipc_store_compare_set(
    store: *const nvfipc_store,
    key: *const c_char,
    expected: *const u8,
    expected_len: usize,
    desired: *const u8,
    desired_len: usize,
    out_value: *mut *mut u8,
    out_len: *mut usize,
) -> Status {
    ffi_call("nvfipc_store_compare_set", || {
        let (store, key) = store_key(store, key)?;
        let expected = value_arg(expected, expected_len, "expected")?;
        let desired = value_arg(desired, desired_len, "desired")?;
        let out_value = out_ptr(out_value, "out_value")?;
        let out_len = out_ptr(out_len, "out_len")?;
        let value = store.compare_set(key, expected, desired)?;
        write_buffer(value, out_value, out_len)
    })
}

/// Appends `value_len` bytes to `key`, creating it when missing.
#[no_mangle]
pub extern "C" fn nvfipc_store_append(
    store: *const nvfipc_store,
    key: *const c_char,
    value: *const u8,
    value_len: usize,
) -> Status {
    ffi_call("nvfipc_store_append", || {
        let (store, key) = store_key(store, key)?;
        store.append(key, value_arg(value, value_len, "value")?)
    })
}

/// Sets `n` keys at once (one message on a TCP store): `keys[i]` to `values[i]`.
#[no_mangle]
pub extern "C" fn nvfipc_store_multi_set(
    store: *const nvfipc_store,
    keys: *const *const c_char,
    values: *const nvfipc_bytes,
    n: usize,
) -> Status {
    ffi_call("nvfipc_store_multi_set", || {
        let store = store_arg(store)?;
        let keys = c_str_array_arg(keys, n, "keys", "n")?;
        let spans = slice_arg(values, n, "values")?;
        let mut pairs = Vec::with_capacity(n);
        for (i, (&key, s)) in keys.iter().zip(spans).enumerate() {
            pairs.push((key, value_arg(s.data, s.len, format_args!("values[{i}]"))?));
        }
        store.multi_set(&pairs)
    })
}

/// Waits (at most `timeout_ms`; < 0: the store's default, 0: check once) until all `n` keys
/// exist, then fills the caller's array `out_values[0..n]` with their values in request order.
/// Release them with `nvfipc_buffers_free(out_values, n)`. On failure nothing is allocated and
/// `out_values` is left untouched.
#[no_mangle]
pub extern "C" fn nvfipc_store_multi_get(
    store: *const nvfipc_store,
    keys: *const *const c_char,
    n: usize,
    timeout_ms: i64,
    out_values: *mut nvfipc_buffer,
) -> Status {
    ffi_call("nvfipc_store_multi_get", || {
        let store = store_arg(store)?;
        let keys = c_str_array_arg(keys, n, "keys", "n")?;
        let outs = out_slice_arg(out_values, n, "out_values")?;
        if keys.is_empty() {
            return Ok(());
        }
        let timeout = wait_bound(&*store, &keys, timeout_ms)?;
        let values = store.multi_get(&keys, timeout)?;
        if values.len() != n {
            return Err(Error::internal(format!(
                "the store returned {} values for {n} keys",
                values.len()
            )));
        }
        outs.write_all(values.into_iter().map(|value| {
            let (data, len) = into_buffer(value);
            nvfipc_buffer { data, len }
        }));
        Ok(())
    })
}

/// Frees the `n` buffers of `values` (as filled by `nvfipc_store_multi_get`) and sets each to
/// `{NULL, 0}`. Entries that are already `{NULL, 0}` are skipped, so calling it twice is safe.
/// Every entry is attempted; the first failure is returned.
#[no_mangle]
pub extern "C" fn nvfipc_buffers_free(values: *mut nvfipc_buffer, n: usize) -> Status {
    ffi_call("nvfipc_buffers_free", || {
        count_arg(n, "n", "NVFIPC_MAX_KEYS", NVFIPC_MAX_KEYS)?;
        let entries = slice_arg(values.cast_const(), n, "values")?.to_vec();
        let outs = out_slice_arg(values, n, "values")?;
        let mut first_error = None;
        outs.write_all(entries.into_iter().enumerate().map(|(i, entry)| {
            match free_buffer(entry.data, entry.len) {
                Ok(()) => nvfipc_buffer {
                    data: std::ptr::null_mut(),
                    len: 0,
                },
                Err(e) => {
                    first_error.get_or_insert(e.context(format!("values[{i}]")));
                    entry
                }
            }
        }));
        first_error.map_or(Ok(()), Err)
    })
}

/// Writes the store's default timeout (used when an operation gets `timeout_ms < 0`) to
/// `*out_timeout_ms`.
#[no_mangle]
pub extern "C" fn nvfipc_store_default_timeout_ms(
    store: *const nvfipc_store,
    out_timeout_ms: *mut i64,
) -> Status {
    ffi_call("nvfipc_store_default_timeout_ms", || {
        let store = store_arg(store)?;
        let out = out_ptr(out_timeout_ms, "out_timeout_ms")?;
        let ms = store.default_timeout().as_millis();
        out.write(i64::try_from(ms).unwrap_or(i64::MAX))
    })
}

/// Releases this reference to the store. Contexts created with the store keep their own
/// reference, so the store may be freed while they still use it; the connection closes when the
/// last user is gone. NULL is a no-op; a second free gives `NVFIPC_STATUS_INVALID_STATE`.
#[no_mangle]
pub extern "C" fn nvfipc_store_free(store: *mut nvfipc_store) -> Status {
    ffi_call("nvfipc_store_free", || take_handle(store, "store"))
}

/// An embedded TCPStore server (PyTorch's wire protocol) running on a background thread of this
/// process; any TCPStore client (this library's, PyTorch's) can connect to it.
///
/// Thread safety: `nvfipc_server_port` and `nvfipc_server_num_clients` may be called from any
/// thread at once; `nvfipc_server_free` must not race with them.
#[derive(Clone)]
pub struct nvfipc_server {
    server: Arc<StoreServer>,
}

impl Handle for nvfipc_server {}

/// Connects to the TCPStore server at `host`:`port` (a PyTorch `TCPStore` master, an
/// `nvfipc_store_serve` server, or `nvfipc serve`), retrying until the server answers or
/// `timeout_ms` runs out. `timeout_ms` also becomes the store's default timeout for waiting
/// operations (< 0: 300 s, as in PyTorch). With `wait_for_workers` > 0, announces this worker
/// like a PyTorch client created with `world_size` = `wait_for_workers` and
/// `wait_for_workers=True` (a PyTorch master waits for these); <= 0 announces nothing.
/// On success `*out_store` receives a new store; free it with `nvfipc_store_free`.
#[no_mangle]
pub extern "C" fn nvfipc_store_connect(
    host: *const c_char,
    port: u16,
    timeout_ms: i64,
    wait_for_workers: i64,
    out_store: *mut *mut nvfipc_store,
) -> Status {
    ffi_call("nvfipc_store_connect", || {
        let host = c_str_arg(host, "host")?;
        let out = out_ptr(out_store, "out_store")?;
        if port == 0 {
            return Err(Error::invalid(format!(
                "port 0 is not a server port (connecting to {host})"
            )));
        }
        let (limit, max) = ("NVFIPC_MAX_WORLD_SIZE", crate::config::MAX_WORLD_SIZE);
        let workers = usize::try_from(wait_for_workers).ok().filter(|&n| n > 0);
        let workers = workers.map(|n| count_arg(n, "wait_for_workers", limit, max));
        let options = ConnectOptions {
            wait_for_workers: workers.transpose()?,
            ..ConnectOptions::with_timeout(timeout_arg(timeout_ms, DEFAULT_TIMEOUT))
        };
        let tcp = Arc::new(crate::store::connect(host, port, &options)?);
        out.write(into_handle(nvfipc_store {
            store: tcp.clone(),
            tcp: Some(tcp),
            callback: None,
        }))
    })
}

/// Makes a store whose operations call the host's functions in `*callbacks` (copied; see
/// `nvfipc_store_callbacks` for the contract: thread-safe callbacks, `ctx` valid until the store
/// and every context using it are freed). Its default timeout is 300 s.
/// On success `*out_store` receives a new store; free it with `nvfipc_store_free`.
#[no_mangle]
pub extern "C" fn nvfipc_store_from_callbacks(
    callbacks: *const nvfipc_store_callbacks,
    out_store: *mut *mut nvfipc_store,
) -> Status {
    ffi_call("nvfipc_store_from_callbacks", || {
        let callbacks = *ref_arg(callbacks, "callbacks")?;
        let out = out_ptr(out_store, "out_store")?;
        let callback = Arc::new(CallbackStore::new(callbacks)?);
        out.write(into_handle(nvfipc_store {
            store: callback.clone(),
            tcp: None,
            callback: Some(callback),
        }))
    })
}

/// Tells a store over host callbacks where its server listens: `host` (NUL-terminated) and
/// `port` are what the host's own client connects to (for nvFuser's `c10d::TCPStore`:
/// `getHost()` and `getPort()`; `nvfipc::c10d::storeFrom` passes them). A rank that closes then
/// sees, without a request, whether a server on this machine is still listening: once it is not,
/// the rank makes no store request (none would succeed, and the host's client may print a
/// warning for each). The rank whose process runs the server (c10d's rank 0) keeps it, when it
/// frees its context, until the other ranks have closed theirs or disconnected (bounded by the
/// context's host linger), so that their last requests are not cut off by its exit. A host on
/// another machine changes nothing. Other stores give `NVFIPC_STATUS_UNSUPPORTED`.
#[no_mangle]
pub extern "C" fn nvfipc_store_set_server_address(
    store: *const nvfipc_store,
    host: *const c_char,
    port: u16,
) -> Status {
    ffi_call("nvfipc_store_set_server_address", || {
        let store = handle_ref(store, "store")?;
        let host = c_str_arg(host, "host")?;
        if host.is_empty() || port == 0 {
            return Err(Error::invalid(format!(
                "server address {host:?}:{port}: a host name and a port in 1..=65535 are needed"
            )));
        }
        let callback = store.callback.as_ref().ok_or_else(|| {
            Error::unsupported(
                "only stores over host callbacks (nvfipc_store_from_callbacks) take a server \
                 address; the library's own stores know theirs",
            )
        })?;
        callback.set_server_address(host, port);
        Ok(())
    })
}

/// Changes the default timeout of a TCP store (used by waiting operations given
/// `timeout_ms < 0`, and by reply reads). `timeout_ms` must be positive. Other stores give
/// `NVFIPC_STATUS_UNSUPPORTED`.
#[no_mangle]
pub extern "C" fn nvfipc_store_set_timeout(store: *const nvfipc_store, timeout_ms: i64) -> Status {
    ffi_call("nvfipc_store_set_timeout", || {
        let store = handle_ref(store, "store")?;
        let ms = positive_arg(timeout_ms, "timeout_ms")?;
        let tcp = store.tcp.as_ref().ok_or_else(|| {
            Error::unsupported("only TCP stores (nvfipc_store_connect) have a settable timeout")
        })?;
        tcp.set_timeout(Duration::from_millis(ms as u64));
        Ok(())
    })
}

/// Round-trips a PING to the server of a TCP store (checks that it is alive and answering) and
/// writes the round-trip time in microseconds to `*out_rtt_us` (may be NULL). Other stores give
/// `NVFIPC_STATUS_UNSUPPORTED`.
#[no_mangle]
pub extern "C" fn nvfipc_store_ping(store: *const nvfipc_store, out_rtt_us: *mut i64) -> Status {
    ffi_call("nvfipc_store_ping", || {
        let store = handle_ref(store, "store")?;
        let out = optional_out_ptr(out_rtt_us, "out_rtt_us")?;
        let tcp = store
            .tcp
            .as_ref()
            .ok_or_else(|| Error::unsupported("ping needs a TCP store (nvfipc_store_connect)"))?;
        out.write(i64::try_from(tcp.ping()?.as_micros()).unwrap_or(i64::MAX))
    })
}

/// Starts a TCPStore server listening on `bind_host`:`port` ("" or "::" listens on every
/// interface, IPv4 and IPv6; "127.0.0.1" only locally; port 0 picks a free port). The port it
/// listens on is written to `*out_port` (may be NULL; see also `nvfipc_server_port`).
/// It serves from `NVFIPC_STORE_THREADS` threads (default 1; 0: one per four cores, at most
/// four); a malformed value fails with `NVFIPC_STATUS_INVALID_ARGUMENT`.
/// On success `*out_server` receives the server; stop it with `nvfipc_server_free`.
#[no_mangle]
pub extern "C" fn nvfipc_store_serve(
    bind_host: *const c_char,
    port: u16,
    out_port: *mut u16,
    out_server: *mut *mut nvfipc_server,
) -> Status {
    ffi_call("nvfipc_store_serve", || {
        let host = c_str_arg(bind_host, "bind_host")?;
        let out_port = optional_out_ptr(out_port, "out_port")?;
        let out = out_ptr(out_server, "out_server")?;
        let server = crate::store::serve_embedded(host, port)?;
        out_port.write(server.port())?;
        out.write(into_handle(nvfipc_server {
            server: Arc::new(server),
        }))
    })
}

/// Writes the port the server listens on to `*out_port`.
#[no_mangle]
pub extern "C" fn nvfipc_server_port(server: *const nvfipc_server, out_port: *mut u16) -> Status {
    ffi_call("nvfipc_server_port", || {
        let port = handle_ref(server, "server")?.server.port();
        out_ptr(out_port, "out_port")?.write(port)
    })
}

/// Writes the number of currently connected clients to `*out_clients`.
#[no_mangle]
pub extern "C" fn nvfipc_server_num_clients(
    server: *const nvfipc_server,
    out_clients: *mut usize,
) -> Status {
    ffi_call("nvfipc_server_num_clients", || {
        let server = handle_ref(server, "server")?;
        out_ptr(out_clients, "out_clients")?.write(server.server.connected_clients())
    })
}

/// Stops the server and frees it. With `idle_timeout_ms` > 0 it first waits, at most that long,
/// until no client is connected, so that ranks still using the store are not cut off; 0 stops at
/// once; < 0 waits up to the default store timeout (300 s). The server is stopped and freed in
/// every case; `NVFIPC_STATUS_TIMEOUT` says clients were still connected. NULL is a no-op; a second free gives `NVFIPC_STATUS_INVALID_STATE`.
#[no_mangle]
pub extern "C" fn nvfipc_server_free(server: *mut nvfipc_server, idle_timeout_ms: i64) -> Status {
    ffi_call("nvfipc_server_free", || {
        let Some(server) = take_handle(server, "server")? else {
            return Ok(());
        };
        if idle_timeout_ms == 0 {
            server.server.shutdown();
            Ok(())
        } else {
            Ok(server
                .server
                .shutdown_when_idle(timeout_arg(idle_timeout_ms, DEFAULT_TIMEOUT))?)
        }
    })
}

#[cfg(test)]
pub(crate) mod tests;
