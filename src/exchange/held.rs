//! A peer mapping held by a cache, counted: the cache's `closes` counter moves when it drops.

use crate::transport::PeerMapping;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A peer mapping (a buffer, or a semaphore slab) that this cache opened: counted one open when
/// made (`Counters::hold`), one close when dropped, which releases the cache's reference.
pub(crate) struct HeldMapping {
    mapping: PeerMapping,
    closes: Arc<AtomicU64>,
}

impl HeldMapping {
    /// `mapping`, whose drop adds one to `closes`.
    pub(crate) fn counted(mapping: PeerMapping, closes: Arc<AtomicU64>) -> HeldMapping {
        HeldMapping { mapping, closes }
    }
}

impl std::ops::Deref for HeldMapping {
    type Target = PeerMapping;

    fn deref(&self) -> &PeerMapping {
        &self.mapping
    }
}

impl Drop for HeldMapping {
    fn drop(&mut self) {
        self.closes.fetch_add(1, Ordering::Relaxed);
    }
}
