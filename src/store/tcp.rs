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

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        Ok(TcpStore::set(self, key, value)?)
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        Ok(TcpStore::get(self, key, timeout)?)
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        Ok(TcpStore::add(self, key, delta)?)
    }

    fn check(&self, keys: &[&str]) -> Result<bool> {
        Ok(TcpStore::check(self, keys)?)
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        Ok(TcpStore::wait(self, keys, timeout)?)
    }

    fn delete_key(&self, key: &str) -> Result<bool> {
        Ok(TcpStore::delete_key(self, key)?)
    }

    fn num_keys(&self) -> Result<i64> {
        Ok(TcpStore::num_keys(self)?)
    }

    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>> {
        Ok(TcpStore::compare_set(self, key, expected, desired)?)
    }

    fn append(&self, key: &str, value: &[u8]) -> Result<()> {
        Ok(TcpStore::append(self, key, value)?)
    }

    fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        Ok(TcpStore::multi_set(self, pairs)?)
    }

    fn multi_get(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        Ok(TcpStore::multi_get(self, keys, timeout)?)
    }

    fn update_then_wait(
        &self,
        delete: &[&str],
        set: Option<(&str, &[u8])>,
        wait: &[&str],
        timeout: Duration,
    ) -> Result<()> {
        Ok(TcpStore::update_then_wait(
            self, delete, set, wait, timeout,
        )?)
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
