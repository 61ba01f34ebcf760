//! Tearing a cache down.
//!
//! Teardown (`close`, `try_close`, drop) never frees what a peer may still map, and needs no
//! barrier: the cache first releases everything it imported (peer buffers and peer semaphore
//! slabs), waits (bounded by the linger) until the releaser thread has closed them, then marks
//! itself closed on its board, then waits, bounded by the
//! linger (`HandleCache::set_linger`), until every peer of its channels has marked itself closed
//! on its own board, has exited, or has no board; only then are the transports (with this rank's
//! semaphore slab) dropped. Releasing before waiting means two ranks closing at the same time
//! never wait on each other. When the linger runs out, the device transport is deliberately kept
//! alive (its slab is leaked rather than freed under a peer's mapping) and the peers that did not
//! close are reported. A closed peer is also refused by the exchange: waiting on it fails at once,
//! and its records are not imported.
//!
//! The teardown's only store traffic is cleanup for peers still open: the collector's last
//! deletes of consumed record keys and the delete of this rank's node key. It is skipped when the
//! store's server has closed the connection, or the store cannot tell whether it is there and
//! every other rank of the job has left (see `crate::departures`), so a rank that closes after its
//! peers (after the store's host) sends nothing that could fail.

use super::channel::ChannelTable;
use super::context::Context;
use super::stats::bump;
use crate::departures;
use crate::error::{Error, Result};
use crate::logging;
use crate::os::wait::{wait_paced, SLEEPING};
use crate::sync::lock;
use crate::transport::MemKind;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Teardowns in this process that stopped waiting for peers to close (and so kept device memory
/// alive on purpose). Drop cannot report anything else.
static TEARDOWNS_TIMED_OUT: AtomicU64 = AtomicU64::new(0);

/// How many cache teardowns in this process gave up waiting for peers to close (each left its
/// device semaphore slab allocated rather than free it under a peer's mapping).
pub fn teardowns_timed_out() -> u64 {
    TEARDOWNS_TIMED_OUT.load(Ordering::Relaxed)
}

/// Tears a cache down (see the module docs): stops the collector, releases every peer mapping
/// and peer semaphore slab, marks this rank closed on its board, and waits, bounded by the
/// linger, until every peer of its channels has closed its cache too (or exited). Returns a
/// `Timeout` naming the peers that did not close; then the device transport is deliberately
/// kept alive. Run once per cache.
pub(super) fn teardown(cx: &Context, table: &Mutex<ChannelTable>) -> Result<()> {
    Teardown { cx }.run(table)
}

struct Teardown<'a> {
    cx: &'a Context,
}

impl Teardown<'_> {
    fn run(&self, table: &Mutex<ChannelTable>) -> Result<()> {
        let cx = self.cx;
        match self.quiet_reason() {
            None => {
                lock(&cx.collector).finish();
                cx.peer_nodes.unpublish(&*cx.store, &cx.names, cx.rank);
            }
            Some(why) => {
                lock(&cx.collector).abandon();
                log::debug!(
                    target: logging::EXCHANGE,
                    "rank {}: closing {} without store traffic (consumed record keys and the \
                     node key {} are left in the store): {why}",
                    cx.rank,
                    cx.names,
                    cx.names.node_key(cx.rank)
                );
            }
        }
        // Release first, so that peers closing at the same time never wait on each other.
        let peers = self.release_everything(table);
        let linger = cx.settings.linger();
        let start = Instant::now();
        // The device transport closes released mappings on its releaser thread once the work
        // queued before their release has finished: this is where they are closed at the latest.
        // Only then does this rank say it has let go of its peers' memory; if that work does not
        // finish within the linger, it never says so, and its peers keep their memory.
        let flushed = self.flush_releases(linger);
        if flushed.is_ok() {
            cx.board.mark_closed();
        }
        let unclosed = self.wait_for_peers_to_close(peers, linger.saturating_sub(start.elapsed()));
        // What dead processes of this node left in /dev/shm: their boards (the survivors clean up).
        super::board::reclaim_dead();
        let names: Vec<String> = {
            let mut boards = lock(&cx.peer_boards);
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
        let leaked = match cx.transports.get(MemKind::Device) {
            Some(t) if exposed_device => {
                // Deliberately never dropped: freeing the slab (or closing the driver state of
                // buffers a peer still maps) while that peer maps it is undefined behaviour.
                std::mem::forget(Arc::clone(t));
                1
            }
            _ => 0,
        };
        bump(&cx.counters.peers_unclosed, unclosed.len() as u64);
        bump(&cx.counters.leaked_slabs, leaked);
        TEARDOWNS_TIMED_OUT.fetch_add(1, Ordering::Relaxed);
        Err(Error::timeout(format!(
            "rank {}: peers that had not closed their caches {:?} after this rank closed \
             (linger {linger:?}): {}. They may still map this rank's buffers and semaphore slab, \
             so {}. Close the cache on every rank that exchanged with this one (a failed rank \
             must exit or close its cache), or raise the bound with set_linger",
            cx.rank,
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

    /// Why the teardown's store cleanup (deleting consumed record keys and this rank's node key,
    /// which only peers still open read) must be skipped, if it must (see
    /// `departures::quiet_reason`).
    fn quiet_reason(&self) -> Option<String> {
        let cx = self.cx;
        departures::quiet_reason(cx.store.liveness(), cx.names.job_id(), cx.rank)
    }

    /// Waits, at most `linger`, until every transport has unmapped what it released.
    fn flush_releases(&self, linger: Duration) -> Result<()> {
        for t in self.cx.transports.existing() {
            t.flush_releases(linger).map_err(|e| {
                e.context(format!(
                    "rank {}: closing the cache (this rank has not marked itself closed, so its \
                     peers keep the memory it may still map)",
                    self.cx.rank
                ))
            })?;
        }
        Ok(())
    }

    /// Releases every peer mapping, peer semaphore slab and own semaphore slot. Returns the peers
    /// of the channels (they may hold this rank's memory), each with whether a device channel
    /// connects them.
    fn release_everything(&self, table: &Mutex<ChannelTable>) -> Vec<(usize, bool)> {
        let cx = self.cx;
        let mut st = lock(table);
        let channels = std::mem::take(&mut st.channels);
        st.by_fp.clear();
        let mut peers: BTreeMap<usize, bool> = BTreeMap::new();
        for ch in channels {
            *peers.entry(ch.info.peer).or_default() |= ch.info.kind == MemKind::Device;
            let t = cx.channel_transport(ch.info.kind);
            if let Some(p) = ch.peer_side {
                cx.release_mapping(ch.info.kind, &p.mapping);
            }
            if let Some(imp) = ch.progress.and_then(|p| p.resume).and_then(|r| r.staged) {
                cx.release_mapping(imp.kind, &imp.mapping);
            }
            let _ = t.semaphores().free_slot(ch.info.slot);
        }
        let mut held = lock(&cx.holdings);
        for (kind, m) in held.retained.drain() {
            cx.release_mapping(kind, &m);
        }
        for ((peer, kind), (handle, _)) in std::mem::take(&mut held.slabs) {
            if let Some(t) = cx.transport(kind) {
                let _ = t.semaphores().release_peer(peer, &handle);
                bump(&cx.counters.closes, 1);
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
            pending.retain(|&(peer, _)| !self.cx.peer_let_go(peer));
            pending.is_empty().then_some(())
        });
        pending
    }
}
