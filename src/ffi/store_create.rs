//! C ABI for making stores: a TCPStore client, an embedded TCPStore server, and a store over
//! host callbacks. The operations on a store are in `store.rs`.

use super::args::{c_str_arg, optional_out_ptr, out_ptr, positive_arg, ref_arg, timeout_arg};
use super::boundary::ffi_call;
use super::registry::{handle_ref, into_handle, take_handle, Handle};
use super::store::nvfipc_store;
use super::store_callbacks::{nvfipc_store_callbacks, CallbackStore};
use crate::config;
use crate::error::{Error, Result, Status};
use crate::store::client::{ConnectOptions, TcpStore};
use crate::store::server::StoreServer;
use crate::store::DEFAULT_TIMEOUT;
use std::ffi::c_char;
use std::sync::Arc;

/// An embedded TCPStore server (PyTorch's wire protocol) running on a background thread of this
/// process; any TCPStore client (this library's, PyTorch's) can connect to it.
///
/// Thread safety: `nvfipc_server_port` and `nvfipc_server_num_clients` may be called from any
/// thread at once; `nvfipc_server_free` must not race with them.
#[allow(non_camel_case_types)]
#[derive(Clone)]
pub struct nvfipc_server {
    server: Arc<StoreServer>,
}

impl Handle for nvfipc_server {
    const C_NAME: &'static str = "nvfipc_server";
}

fn connect(host: &str, port: u16, timeout_ms: i64, wait_for_workers: i64) -> Result<nvfipc_store> {
    let timeout = timeout_arg(timeout_ms, DEFAULT_TIMEOUT);
    let options = ConnectOptions {
        timeout,
        connect_timeout: timeout,
        wait_for_workers: usize::try_from(wait_for_workers).ok().filter(|&n| n > 0),
    };
    let tcp = Arc::new(TcpStore::connect(host, port, &options)?);
    Ok(nvfipc_store {
        store: tcp.clone(),
        tcp: Some(tcp),
        callback: None,
    })
}

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
        let store = connect(host, port, timeout_ms, wait_for_workers)?;
        out.write(into_handle(store));
        Ok(())
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
        }));
        Ok(())
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
        match &store.callback {
            Some(callback) => {
                callback.set_server_address(host, port);
                Ok(())
            }
            None => Err(Error::unsupported(
                "only stores over host callbacks (nvfipc_store_from_callbacks) take a server \
                 address; the library's own stores know theirs",
            )),
        }
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
        match &store.tcp {
            Some(tcp) => {
                tcp.set_timeout(std::time::Duration::from_millis(ms as u64));
                Ok(())
            }
            None => Err(Error::unsupported(
                "only TCP stores (nvfipc_store_connect) have a settable timeout",
            )),
        }
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
        let Some(tcp) = &store.tcp else {
            return Err(Error::unsupported(
                "ping needs a TCP store (nvfipc_store_connect)",
            ));
        };
        let rtt = tcp.ping()?;
        if let Some(out) = out {
            out.write(i64::try_from(rtt.as_micros()).unwrap_or(i64::MAX));
        }
        Ok(())
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
        let server = StoreServer::bind_with(host, port, &config::embedded_server_options()?)?;
        if let Some(p) = out_port {
            p.write(server.port());
        }
        out.write(into_handle(nvfipc_server {
            server: Arc::new(server),
        }));
        Ok(())
    })
}

/// Writes the port the server listens on to `*out_port`.
#[no_mangle]
pub extern "C" fn nvfipc_server_port(server: *const nvfipc_server, out_port: *mut u16) -> Status {
    ffi_call("nvfipc_server_port", || {
        let server = handle_ref(server, "server")?;
        out_ptr(out_port, "out_port")?.write(server.server.port());
        Ok(())
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
        out_ptr(out_clients, "out_clients")?.write(server.server.connected_clients());
        Ok(())
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
            server
                .server
                .shutdown_when_idle(timeout_arg(idle_timeout_ms, DEFAULT_TIMEOUT))
        }
    })
}
