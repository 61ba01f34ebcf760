//! A cache's tunables, changeable at any time from any thread: the exchange timeout, the
//! teardown's linger and how many replaced peer mappings are kept.

use super::retain::DEFAULT_RETAINED_PER_PEER;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Upper bound of the default [linger](super::HandleCache::linger): min(timeout, this).
pub const DEFAULT_MAX_LINGER: Duration = Duration::from_secs(30);
/// `linger_ns` value meaning "derived from the timeout".
const LINGER_FROM_TIMEOUT: u64 = u64::MAX;

fn nanos(d: Duration) -> u64 {
    d.as_nanos().min(u64::MAX as u128) as u64
}

pub(super) struct Settings {
    timeout_ns: AtomicU64,
    /// `LINGER_FROM_TIMEOUT` until set.
    linger_ns: AtomicU64,
    retain_per_peer: AtomicUsize,
}

impl Settings {
    pub(super) fn new(timeout: Duration) -> Settings {
        Settings {
            timeout_ns: AtomicU64::new(nanos(timeout)),
            linger_ns: AtomicU64::new(LINGER_FROM_TIMEOUT),
            retain_per_peer: AtomicUsize::new(DEFAULT_RETAINED_PER_PEER),
        }
    }

    pub(super) fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    pub(super) fn set_timeout(&self, timeout: Duration) {
        self.timeout_ns.store(nanos(timeout), Ordering::Relaxed);
    }

    pub(super) fn linger(&self) -> Duration {
        match self.linger_ns.load(Ordering::Relaxed) {
            LINGER_FROM_TIMEOUT => self.timeout().min(DEFAULT_MAX_LINGER),
            ns => Duration::from_nanos(ns),
        }
    }

    pub(super) fn set_linger(&self, linger: Duration) {
        let ns = linger.as_nanos().min(u128::from(LINGER_FROM_TIMEOUT - 1)) as u64;
        self.linger_ns.store(ns, Ordering::Relaxed);
    }

    pub(super) fn retained_per_peer(&self) -> usize {
        self.retain_per_peer.load(Ordering::Relaxed)
    }

    pub(super) fn set_retained_per_peer(&self, per_peer: usize) {
        self.retain_per_peer.store(per_peer, Ordering::Relaxed);
    }
}
