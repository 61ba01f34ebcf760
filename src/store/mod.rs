//! Key-value stores: the [`Store`] trait that the barrier and the exchange use, over PyTorch's
//! TCPStore (the `nvfipc-store` crate of this workspace: its wire codec, client and server are
//! re-exported here as [`wire`], [`client`] and [`server`]; `tcp` joins them to the library) or
//! over a host's C vtable (`ffi::store_callbacks`). Keys are *user keys*, as in `c10d::Store`.

#[cfg(test)]
#[path = "tests/memory.rs"]
pub(crate) mod memory;
mod tcp;
#[cfg(test)]
mod tests;

use crate::error::Result;
pub use nvfipc_store::{client, server, wire, DEFAULT_TIMEOUT};
use std::time::{Duration, Instant};
pub use tcp::{connect, serve_embedded};

// A world barrier names every rank in one WAIT.
const _: () = assert!(crate::config::MAX_WORLD_SIZE == wire::MAX_KEY_COUNT);

/// What a store can tell about its server without sending a request (see [`Store::liveness`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Reachable as far as can be seen: the server is here, or the connection to it is open.
    Alive,
    /// The server closed the connection or the connection failed: every request would fail.
    Gone,
    /// The store cannot tell without a request (a store implemented by the host, for example).
    Unknown,
    /// A host's server runs in this process (nvFuser's rank 0 `c10d::TCPStore`) with
    /// `other_clients` connections of other processes open: it goes when this process exits.
    ServedHere { other_clients: usize },
}

/// [`Store::multi_get`] as a `wait` then a `get` of each key, all within `timeout`.
pub(crate) fn wait_then_get<S: Store + ?Sized>(
    store: &S,
    keys: &[&str],
    timeout: Duration,
) -> Result<Vec<Vec<u8>>> {
    let deadline = Instant::now() + timeout;
    store.wait(keys, timeout)?;
    let left = || deadline.saturating_duration_since(Instant::now());
    keys.iter().map(|k| store.get(k, left())).collect()
}

/// A key-value store with the semantics of `c10d::Store`, shared between threads; each call is
/// atomic. Only the waiting operations (`get`, `wait`, `multi_get`, `update_then_wait`) take a
/// timeout, and it bounds the whole call, whatever the store's default: a wait that lasts up to
/// it is never cut short by the default, nor are the other replies of the call. The other
/// operations are bounded by [`Store::default_timeout`].
pub trait Store: Send + Sync {
    /// Upserts `key`; wakes waiters of `key`.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// Waits until `key` exists (at most `timeout`), then returns its value.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;
    /// Adds `delta` to the decimal counter at `key` (missing counts as 0); returns the new value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// True when every key exists. Never blocks.
    fn check(&self, keys: &[&str]) -> Result<bool>;
    /// Blocks until every key exists, or fails with a timeout naming the keys.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()>;
    /// Deletes `key`; true when it existed.
    fn delete_key(&self, key: &str) -> Result<bool>;
    /// Number of keys in the store (internal keys included, as in torch).
    fn num_keys(&self) -> Result<i64>;
    /// c10d's compare-and-set, including its "missing key with non-empty expected" rule.
    fn compare_set(&self, key: &str, expected: &[u8], desired: &[u8]) -> Result<Vec<u8>>;
    /// Appends to `key`, creating it when missing.
    fn append(&self, key: &str, value: &[u8]) -> Result<()>;

    /// Sets several keys at once (one message on the TCP store).
    fn multi_set(&self, pairs: &[(&str, &[u8])]) -> Result<()> {
        for (k, v) in pairs {
            self.set(k, v)?;
        }
        Ok(())
    }

    /// Waits for every key, then returns the values in request order.
    fn multi_get(&self, keys: &[&str], timeout: Duration) -> Result<Vec<Vec<u8>>> {
        wait_then_get(self, keys, timeout)
    }

    /// Deletes every key of `delete` (missing ones are fine), sets `set` when given, then waits
    /// for every key of `wait`. The TCP client sends it all in one message.
    fn update_then_wait(
        &self,
        delete: &[&str],
        set: Option<(&str, &[u8])>,
        wait: &[&str],
        timeout: Duration,
    ) -> Result<()> {
        for old in delete {
            self.delete_key(old)?;
        }
        if let Some((key, value)) = set {
            self.set(key, value)?;
        }
        if wait.is_empty() {
            return Ok(());
        }
        self.wait(wait, timeout)
    }

    /// The timeout used when a caller does not give one.
    fn default_timeout(&self) -> Duration {
        DEFAULT_TIMEOUT
    }

    /// Whether the store can still be reached, seen without a request (for teardown, where a
    /// request to a server that has gone would fail).
    fn liveness(&self) -> Liveness {
        Liveness::Unknown
    }

    /// A second connection to the same store, for a background user (the exchange's key
    /// collector); `None` when the store cannot open one.
    fn separate_connection(&self) -> Option<std::sync::Arc<dyn Store>> {
        None
    }
}
