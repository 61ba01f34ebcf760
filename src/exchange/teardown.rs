//! Tearing a cache down.
//!
//! Teardown (`close`, `try_close`, drop) never frees what a peer may still map, and needs no
//! barrier: the cache first releases everything it imported (peer buffers and peer semaphore
//! slabs), waits (bounded by the linger) until the releaser thread has closed them, then marks
//! itself closed on its board, then waits, bounded by the
//! [linger](HandleCache::set_linger), until every peer of its channels has marked itself closed
//! on its own board, has exited, or has no board; only then are the transports (with this rank's
//! semaphore slab) dropped. Releasing before waiting means two ranks closing at the same time
//! never wait on each other. When the linger runs out, the device transport is deliberately kept
//! alive (its slab is leaked rather than freed under a peer's mapping) and the peers that did not
//! close are reported. A closed peer is also refused by the exchange: waiting on it fails at once,
//! and its records are not imported.

use super::cache::HandleCache;
use super::stats::{bump, CacheStats};
use crate::error::{Error, Result};
use crate::os::wait::{wait_paced, SLEEPING};
use crate::sync::lock;
use crate::transport::MemKind;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Teardowns in this process that stopped waiting for peers to close (and so kept device memory
/// alive on purpose). Drop cannot report anything else.
static TEARDOWNS_TIMED_OUT: AtomicU64 = AtomicU64::new(0);

/// How many cache teardowns in this process gave up waiting for peers to close (each left its
/// device semaphore slab allocated rather than free it under a peer's mapping).
pub fn teardowns_timed_out() -> u64 {
    TEARDOWNS_TIMED_OUT.load(Ordering::Relaxed)
}

impl HandleCache {
    /// Tears the cache down (see the module docs) and returns the final counters. Never fails:
    /// when peers did not close within the [linger](Self::linger), the counters say so
    /// (`peers_unclosed`, `leaked_slabs`); [`try_close`](Self::try_close) names them.
    pub fn close(self) -> CacheStats {
        let mut this = self;
        let _ = this.teardown();
        this.stats()
    }

    /// Tears the cache down: waits for the collector to delete the consumed keys, releases every
    /// peer mapping and peer semaphore slab, marks this rank closed on its board, and waits,
    /// bounded by the [linger](Self::linger), until every peer of its channels has closed its
    /// cache too (or exited) before freeing this rank's semaphore slab. Returns the final
    /// counters, or a `Timeout` naming the peers that did not close; then the device semaphore
    /// slab is deliberately left allocated (a peer may still map it), and so must be any buffer
    /// this rank exported to those peers.
    pub fn try_close(self) -> Result<CacheStats> {
        let mut this = self;
        this.teardown()?;
        Ok(this.stats())
    }

    fn teardown(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        lock(&self.collector).finish();
        self.peer_nodes.unpublish(&*self.cfg.store);
        // Release first, so that peers closing at the same time never wait on each other.
        let peers = self.release_everything();
        let linger = self.linger();
        let start = Instant::now();
        // The device transport closes released mappings on its releaser thread once the work
        // queued before their release has finished: this is where they are closed at the latest.
        // Only then does this rank say it has let go of its peers' memory; if that work does not
        // finish within the linger, it never says so, and its peers keep their memory.
        let flushed = self.flush_releases(linger);
        if flushed.is_ok() {
            self.board.mark_closed();
        }
        let unclosed = self.wait_for_peers_to_close(peers, linger.saturating_sub(start.elapsed()));
        self.reclaim_dead_segments();
        let names: Vec<String> = {
            let mut boards = lock(&self.peer_boards);
            let names = unclosed
                .iter()
                .map(|&(peer, _)| match boards.get(&peer) {
                    Some(b) => format!("rank {peer} (pid {})", b.owner_pid()),
                    None => format!("rank {peer}"),
                })
                .collect();
            boards.clear();
            names
        };
        if unclosed.is_empty() {
            return flushed;
        }
        let exposed_device = unclosed.iter().any(|&(_, device)| device);
        let leaked = match self.transports.get(MemKind::Device) {
            Some(t) if exposed_device => {
                // Deliberately never dropped: freeing the slab (or closing the driver state of
                // buffers a peer still maps) while that peer maps it is undefined behaviour.
                std::mem::forget(Arc::clone(t));
                1
            }
            _ => 0,
        };
        bump(&self.counters.peers_unclosed, unclosed.len() as u64);
        bump(&self.counters.leaked_slabs, leaked);
        TEARDOWNS_TIMED_OUT.fetch_add(1, Ordering::Relaxed);
        Err(Error::timeout(format!(
            "rank {}: peers that had not closed their caches {:?} after this rank closed \
             (linger {linger:?}): {}. They may still map this rank's buffers and semaphore slab, \
             so {}. Close the cache on every rank that exchanged with this one (a failed rank \
             must exit or close its cache), or raise the bound with set_linger",
            self.cfg.rank,
            start.elapsed(),
            names.join(", "),
            if leaked > 0 {
                "the device semaphore slab was left allocated on purpose; keep the buffers \
                 exported to them alive too"
            } else {
                "keep the buffers exported to them alive until they exit"
            }
        )))
    }

    /// Waits, at most `linger`, until every transport has unmapped what it released.
    fn flush_releases(&self, linger: Duration) -> Result<()> {
        for t in self.transports.existing() {
            t.flush_releases(linger).map_err(|e| {
                e.context(format!(
                    "rank {}: closing the cache (this rank has not marked itself closed, so its \
                     peers keep the memory it may still map)",
                    self.cfg.rank
                ))
            })?;
        }
        Ok(())
    }

    /// Releases every peer mapping, peer semaphore slab and own semaphore slot. Returns the peers
    /// of the channels (they may hold this rank's memory), each with whether a device channel
    /// connects them.
    fn release_everything(&self) -> Vec<(usize, bool)> {
        let mut st = lock(&self.table);
        let channels = std::mem::take(&mut st.channels);
        st.by_fp.clear();
        let mut peers: BTreeMap<usize, bool> = BTreeMap::new();
        for ch in channels {
            *peers.entry(ch.info.peer).or_default() |= ch.info.kind == MemKind::Device;
            let t = self
                .transport(ch.info.kind)
                .expect("channel kinds have transports");
            if let Some(p) = ch.peer_side {
                self.release_mapping(ch.info.kind, &p.mapping);
            }
            if let Some(imp) = ch.resume.and_then(|r| r.staged) {
                self.release_mapping(imp.kind, &imp.mapping);
            }
            let _ = t.semaphores().free_slot(ch.info.slot);
        }
        for (kind, m) in st.retained.drain() {
            self.release_mapping(kind, &m);
        }
        for ((peer, kind), (handle, _)) in std::mem::take(&mut st.peer_slabs) {
            if let Some(t) = self.transport(kind) {
                let _ = t.semaphores().release_peer(peer, &handle);
                bump(&self.counters.closes, 1);
            }
        }
        peers.into_iter().collect()
    }

    /// Waits, at most `linger`, until every peer has let go of this rank's memory; returns the
    /// ones that have not.
    fn wait_for_peers_to_close(
        &self,
        mut pending: Vec<(usize, bool)>,
        linger: Duration,
    ) -> Vec<(usize, bool)> {
        wait_paced(SLEEPING, linger, || {
            pending.retain(|&(peer, _)| !self.peer_let_go(peer));
            pending.is_empty().then_some(())
        });
        pending
    }

    /// Whether `peer` can no longer map this rank's memory: it marked its board closed, its
    /// process has exited, or no live board of it can be found (it never created its cache, its
    /// board was removed, or it belongs to a dead process). A board of another layout belongs to
    /// an incompatible version, which could never have exchanged with this one.
    pub(crate) fn peer_let_go(&self, peer: usize) -> bool {
        match self.peer_board(peer) {
            Ok(Some(b)) => b.closed() || !b.owner_alive(),
            Ok(None) | Err(_) => true,
        }
    }
}

impl Drop for HandleCache {
    fn drop(&mut self) {
        // Drop cannot report a timeout: it is counted in `teardowns_timed_out`.
        let _ = self.teardown();
    }
}
