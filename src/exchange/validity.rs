//! The generation of one channel's handles: what an opened channel (`open_channel`) compares
//! with to know that the handles it holds are still the channel's.

use std::sync::atomic::{AtomicU64, Ordering};

/// Generation of a channel whose cache was torn down.
pub(super) const CLOSED: u64 = u64::MAX;
/// Generation of a channel whose last exchange failed.
pub(super) const FAILED: u64 = u64::MAX - 1;

/// The generation of one channel's handles, shared by the channel and every handle opened on it.
/// Changed only under the cache's table lock; read without any lock.
#[derive(Debug, Default)]
pub(super) struct Validity {
    generation: AtomicU64,
}

impl Validity {
    pub(super) fn current(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The channel's handles changed: handles opened before are stale.
    pub(super) fn bump(&self) {
        // Never reaches FAILED: one bump per exchange that changes a buffer.
        let _ = self
            .generation
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
                (g < FAILED - 1).then_some(g + 1)
            });
    }

    /// The channel failed in an exchange (its handles are unknown from here on).
    pub(super) fn fail(&self) {
        let _ = self
            .generation
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
                (g != CLOSED).then_some(FAILED)
            });
    }

    /// The cache is being torn down: no handle of the channel is usable again.
    pub(super) fn close(&self) {
        self.generation.store(CLOSED, Ordering::Release);
    }
}
