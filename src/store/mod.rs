//! Key-value stores: the [`Store`] trait that the barrier and the exchange use, a client and an
//! embedded server for PyTorch's TCPStore wire protocol, and a store backed by host callbacks.
//!
//! Keys given to a [`Store`] are *user keys*, as in `c10d::Store`: the TCP client puts the `/`
//! prefix on the wire exactly like torch's client, so Python code sees the same keys.

pub mod callback;
pub mod client;
pub mod server;
pub mod wire;

use crate::error::Result;
use std::ops::RangeInclusive;
use std::time::Duration;

/// PyTorch's default store timeout (`Store::kDefaultTimeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// A key-value store with the semantics of `c10d::Store`.
///
/// Implementations are shared between threads; each call is atomic with respect to the others
/// on the same object. Only the waiting operations (`get`, `wait`, `multi_get`) take a timeout.
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
        self.wait(keys, timeout)?;
        keys.iter().map(|k| self.get(k, timeout)).collect()
    }

    /// One barrier arrival: adds 1 to `arrival.counter`; when the new value is `arrival.owns`'s
    /// end this caller is the last, so it sets `arrival.release_key` (and deletes
    /// `arrival.retire_key`); otherwise, when the value lies in `arrival.owns`, waits up to
    /// `timeout` for the release key. A value outside `owns` returns
    /// [`ArrivalOutcome::OutOfRange`] without waiting.
    ///
    /// The default makes the ordinary calls one after the other; the TCP client sends the ADD and
    /// the WAIT in one message, so a rank that is not last spends one round trip.
    fn arrive(&self, arrival: &Arrival<'_>, timeout: Duration) -> Result<ArrivalOutcome> {
        let count = self.add(arrival.counter, 1)?;
        if !arrival.owns.contains(&count) {
            return Ok(ArrivalOutcome::OutOfRange(count));
        }
        if count == *arrival.owns.end() {
            self.set(arrival.release_key, b"1")?;
            if let Some(old) = arrival.retire_key {
                self.delete_key(old)?;
            }
            return Ok(ArrivalOutcome::Released(count));
        }
        match self.wait(&[arrival.release_key], timeout) {
            Ok(()) => Ok(ArrivalOutcome::Arrived(count)),
            Err(e) if e.status == crate::error::Status::Timeout => {
                Ok(ArrivalOutcome::Waiting(count))
            }
            Err(e) => Err(e),
        }
    }

    /// The timeout used when a caller does not give one.
    fn default_timeout(&self) -> Duration {
        DEFAULT_TIMEOUT
    }
}

/// The keys of one barrier arrival (see [`Store::arrive`]).
#[derive(Debug, Clone)]
pub struct Arrival<'a> {
    /// The member set's counter.
    pub counter: &'a str,
    /// The counter values this generation owns; the last one releases.
    pub owns: RangeInclusive<i64>,
    /// Set by the last arriver; the others wait for it.
    pub release_key: &'a str,
    /// The previous generation's release key, deleted by the last arriver.
    pub retire_key: Option<&'a str>,
}

/// What [`Store::arrive`] saw; each carries the counter value the ADD returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrivalOutcome {
    /// This caller was last and released the others.
    Released(i64),
    /// The release key appeared within the timeout.
    Arrived(i64),
    /// The timeout passed first; nothing is left pending on the store.
    Waiting(i64),
    /// The counter left the owned range: the members are out of step.
    OutOfRange(i64),
}
