//! The TCPStore crate joined to the library: its errors become the library's (same status, same
//! message), [`Store`] over its client, and its client and embedded server started with the
//! library's logger installed and its settings read.

use super::{Liveness, Store};
use crate::config::{process_env, store_threads_from_lookup};
use crate::error::{Error, Result, Status};
use nvfipc_store::client::{ConnectOptions, ConnectionState, TcpStore};
use nvfipc_store::server::{ServerOptions, StoreServer};
use std::sync::Arc;
use std::time::Duration;

impl From<nvfipc_store::Error> for Error {
    fn from(e: nvfipc_store::Error) -> Error {
        let status = match e.status {
            nvfipc_store::Status::InvalidArgument => Status::InvalidArgument,
            nvfipc_store::Status::Timeout => Status::Timeout,
            nvfipc_store::Status::Io => Status::Io,
            nvfipc_store::Status::Protocol => Status::Protocol,
            nvfipc_store::Status::InvalidState => Status::InvalidState,
        };
        Error::new(status, e.message)
    }
}

/// [`TcpStore::connect`], with the library's logger installed first (this can be a process's
/// first call into the library).
pub fn connect(host: &str, port: u16, opts: &ConnectOptions) -> Result<TcpStore> {
    crate::logging::init();
    Ok(TcpStore::connect(host, port, opts)?)
}

/// A store server embedded in this process: the default options with `NVFIPC_STORE_THREADS`
/// event loops, the library's logger installed first.
pub fn serve_embedded(host: &str, port: u16) -> Result<StoreServer> {
    crate::logging::init();
    let opts = ServerOptions {
        threads: store_threads_from_lookup(process_env)?,
        ..ServerOptions::default()
    };
    Ok(StoreServer::bind_with(host, port, &opts)?)
}

/// `Store` methods that call `TcpStore`'s own of the same name and arguments, errors converted.
macro_rules! delegate {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        $(fn $name(&self, $($arg: $ty),*) -> Result<$out> {
            Ok(TcpStore::$name(self, $($arg),*)?)
        })*
    };
}

impl Store for TcpStore {
    delegate! {
        set(key: &str, value: &[u8]) -> ();
        get(key: &str, timeout: Duration) -> Vec<u8>;
        add(key: &str, delta: i64) -> i64;
        check(keys: &[&str]) -> bool;
        wait(keys: &[&str], timeout: Duration) -> ();
        delete_key(key: &str) -> bool;
        num_keys() -> i64;
        compare_set(key: &str, expected: &[u8], desired: &[u8]) -> Vec<u8>;
        append(key: &str, value: &[u8]) -> ();
        multi_set(pairs: &[(&str, &[u8])]) -> ();
        multi_get(keys: &[&str], timeout: Duration) -> Vec<Vec<u8>>;
        update_then_wait(
            delete: &[&str],
            set: Option<(&str, &[u8])>,
            wait: &[&str],
            timeout: Duration
        ) -> ();
    }

    fn default_timeout(&self) -> Duration {
        self.timeout()
    }

    fn liveness(&self) -> Liveness {
        match self.connection_state() {
            ConnectionState::Open => Liveness::Alive,
            ConnectionState::Closed => Liveness::Gone,
            ConnectionState::Busy => Liveness::Unknown,
        }
    }

    fn separate_connection(&self) -> Option<Arc<dyn Store>> {
        Some(Arc::new(self.duplicate().ok()?))
    }
}
