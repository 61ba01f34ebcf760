//! A cache's teardown: `close`, `try_close` and drop run it once; it releases everything, waits
//! (bounded by the linger) for the peers to let go, and never frees what a peer may still map
//! (docs/PROTOCOL.md, "Closing a cache").

use super::cache::HandleCache;
use super::channel::ChannelTable;
use super::session::{bump, CacheStats, Session};
use crate::departures;
use crate::error::{Error, Result};
use crate::logging;
use crate::os::wait::{wait_paced, SLEEPING};
use crate::sync::lock;
use crate::transport::MemKind;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

impl HandleCache {
    /// Tears the cache down (see the module docs) and returns the final counters. Never
    /// fails: when peers did not close within the [linger](Self::linger), the counters say so
    /// (`peers_unclosed`, `leaked_slabs`); [`try_close`](Self::try_close) names them.
    pub fn close(self) -> CacheStats {
        let mut this = self;
        let _ = this.teardown();
        this.stats()
    }

    /// Tears the cache down (see the module docs) and returns the final counters, or a `Timeout`
    /// naming the peers that did not close within the [linger](Self::linger); then the device
    /// semaphore slab is left allocated on purpose, and so must be any buffer this rank exported
    /// to those peers.
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
        // Opened channels go stale before anything they point to is released.
        for ch in &lock(&self.table).channels {
            ch.validity.close();
        }
        // Views first: they map peers' memory that the teardown lets go of.
        lock(&self.symmetric).tags.clear();
        self.cx.teardown(&self.table)
    }
}

impl Drop for HandleCache {
    fn drop(&mut self) {
        // Drop cannot report a timeout: the peers that did not close are left unnamed.
        let _ = self.teardown();
    }
}

/// A cache's teardown (see the module docs), run once per cache.
impl Session {
    fn teardown(&self, table: &Mutex<ChannelTable>) -> Result<()> {
        match departures::quiet_reason(self.store.liveness(), self.names.job_id(), self.rank) {
            None => {
                lock(&self.collector).finish();
                let _ = self.store.delete_key(&self.names.node_key(self.rank));
            }
            Some(why) => {
                lock(&self.collector).abandon();
                log::debug!(
                    target: logging::EXCHANGE,
                    "rank {}: closing {} without store traffic (consumed record keys and the \
                     node key {} are left in the store): {why}",
                    self.rank,
                    self.names,
                    self.names.node_key(self.rank)
                );
            }
        }
        // Release first, so that peers closing at the same time never wait on each other.
        let peers = self.release_everything(table);
        let linger = self.settings.linger();
        let start = Instant::now();
        // Only once the transports have unmapped what they released (the device one waits for
        // the work queued before) does this rank say it let go of its peers' memory.
        let flushed = self.transports.existing().try_for_each(|t| {
            t.flush_releases(linger).map_err(|e| {
                e.context(format!(
                    "rank {}: closing the cache (this rank has not marked itself closed, so its \
                     peers keep the memory it may still map)",
                    self.rank
                ))
            })
        });
        if flushed.is_ok() {
            self.board.mark_closed();
        }
        // Waits until every peer has let go of this rank's memory.
        let mut unclosed = peers;
        wait_paced(SLEEPING, linger.saturating_sub(start.elapsed()), || {
            unclosed.retain(|&(peer, _)| !self.peer_let_go(peer));
            unclosed.is_empty().then_some(())
        });
        // What dead processes of this node left in /dev/shm: their boards (the survivors clean up).
        super::board::reclaim_dead();
        let boards = std::mem::take(&mut *lock(&self.peer_boards));
        let names: Vec<String> = unclosed
            .iter()
            .map(|&(peer, _)| match boards.get(&peer) {
                Some(b) => format!("rank {peer} (pid {})", b.owner().pid),
                None => format!("rank {peer}"),
            })
            .collect();
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
        Err(Error::timeout(format!(
            "rank {}: peers that had not closed their caches {:?} after this rank closed \
             (linger {linger:?}): {}. They may still map this rank's buffers and semaphore slab, \
             so {}. Close the cache on every rank that exchanged with this one (a failed rank \
             must exit or close its cache), or raise the bound with set_linger",
            self.rank,
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

    /// Drops the guards of every peer mapping and peer semaphore slab (kept ones included) and
    /// frees every own semaphore slot. Returns the peers, each with whether a device channel
    /// connects them.
    fn release_everything(&self, table: &Mutex<ChannelTable>) -> Vec<(usize, bool)> {
        let mut st = lock(table);
        let channels = std::mem::take(&mut st.channels);
        st.by_fp.clear();
        let mut peers: BTreeMap<usize, bool> = BTreeMap::new();
        for ch in channels {
            *peers.entry(ch.info.peer).or_default() |= ch.info.kind == MemKind::Device;
            // A symmetric channel's NO_SLOT is refused as out of range, and ignored here.
            let slab = self.channel_transport(ch.info.kind).semaphores();
            let _ = slab.free_slot(ch.info.slot);
            // Its guards go with it: the peer's buffer, and one a suspended step opened.
        }
        // The peers' slabs and the replaced mappings kept for reuse.
        drop(std::mem::take(&mut *lock(&self.holdings)));
        peers.into_iter().collect()
    }
}
