//! Counters of a handle cache.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Counters of a cache, cumulative since creation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[repr(C)]
pub struct CacheStats {
    /// `exchange_handles` calls that succeeded.
    pub exchanges: u64,
    /// Channel-steps where neither side's buffer changed.
    pub hits: u64,
    /// Channel-steps where at least one side's buffer changed.
    pub misses: u64,
    /// Store calls on the exchange path (each `multi_set` or `multi_get` counts one), apart from
    /// `peer_lookups`.
    pub store_round_trips: u64,
    /// Records published, and their encoded bytes.
    pub records_sent: u64,
    pub record_bytes_sent: u64,
    /// Records fetched and imported.
    pub records_received: u64,
    /// Imports (buffer mappings and peer semaphore slabs) and their releases.
    pub opens: u64,
    pub closes: u64,
    /// Consumed records deleted from the store by the background collector.
    pub keys_deleted: u64,
    /// Peers that had not closed their caches when this cache's teardown stopped waiting for them
    /// (they may still map this rank's memory; see `HandleCache::try_close`).
    pub peers_unclosed: u64,
    /// Device transports (with their semaphore slab) deliberately left allocated by a teardown
    /// that timed out, rather than freed under a peer's mapping.
    pub leaked_slabs: u64,
    /// Reads of peers' node identities (one `WAIT` + `MULTI_GET` each), made at most once per
    /// peer and only when a first exchange found no board of the peer on this node yet.
    pub peer_lookups: u64,
    /// Peer buffers imported without a store fetch: the board said where they lie, inside an
    /// allocation whose record this rank already held (the caching allocator's pattern).
    pub records_known: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) exchanges: AtomicU64,
    pub(crate) hits: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) store_round_trips: AtomicU64,
    pub(crate) records_sent: AtomicU64,
    pub(crate) record_bytes_sent: AtomicU64,
    pub(crate) records_received: AtomicU64,
    pub(crate) opens: AtomicU64,
    pub(crate) closes: AtomicU64,
    pub(crate) keys_deleted: Arc<AtomicU64>,
    pub(crate) peers_unclosed: AtomicU64,
    pub(crate) leaked_slabs: AtomicU64,
    pub(crate) peer_lookups: AtomicU64,
    pub(crate) records_known: AtomicU64,
    /// Time per phase of a call, when asked for.
    pub(crate) phases: super::phases::PhaseClock,
}

pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// A snapshot of the counters.
    pub(crate) fn snapshot(&self) -> CacheStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CacheStats {
            exchanges: l(&self.exchanges),
            hits: l(&self.hits),
            misses: l(&self.misses),
            store_round_trips: l(&self.store_round_trips),
            records_sent: l(&self.records_sent),
            record_bytes_sent: l(&self.record_bytes_sent),
            records_received: l(&self.records_received),
            opens: l(&self.opens),
            closes: l(&self.closes),
            keys_deleted: l(&self.keys_deleted),
            peers_unclosed: l(&self.peers_unclosed),
            leaked_slabs: l(&self.leaked_slabs),
            peer_lookups: l(&self.peer_lookups),
            records_known: l(&self.records_known),
        }
    }
}
