//! Which peers this rank can map, learnt once per peer through the store.
//!
//! Each cache publishes its node identity (`crate::node`) under
//! `nvfipc/<job>/<scope>/g<generation>/node/<rank>` when it is created (a SET, no reply) and deletes it when it
//! closes. When a rank is about to wait for a peer's node-local board that is not there, it reads
//! the peer's identity (waiting, bounded, until the peer has created its cache) and compares it
//! with its own: a peer
//! on another host, or in a container that shares neither this IPC namespace nor this `/dev/shm`,
//! is refused at once, on both sides, with a message saying so, instead of timing out waiting for
//! a board that can never appear. Afterwards the answer is cached: warm exchanges never look.

use crate::error::{Error, Result};
use crate::node::{NodeIdentity, Reach};
use crate::store::Store;
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::names::CacheNames;

/// This rank's view of its peers' nodes (the cache's names and rank are the caller's).
pub struct PeerNodes {
    /// Peers found mappable: their pid, when it can be checked from here.
    known: Mutex<HashMap<usize, Option<u32>>>,
}

impl PeerNodes {
    /// Publishes this rank's identity.
    pub fn publish(store: &dyn Store, names: &CacheNames, rank: usize) -> Result<PeerNodes> {
        let key = names.node_key(rank);
        store
            .set(&key, NodeIdentity::local().encode().as_bytes())
            .map_err(|e| e.context(format!("rank {rank}: publishing its node identity ({key})")))?;
        Ok(PeerNodes {
            known: Mutex::new(HashMap::new()),
        })
    }

    /// True when `peer` was already found mappable (a map lookup; no store traffic).
    pub fn known(&self, peer: usize) -> bool {
        lock(&self.known).contains_key(&peer)
    }

    /// The pid of `peer`'s process, as its cache published it, when that process has exited and
    /// its pid can be checked from here; `None` otherwise (alive, not looked up, or elsewhere).
    /// For a peer whose board this rank never opened (it died before), the only trace left.
    pub fn exited(&self, peer: usize) -> Option<u32> {
        let pid = (*lock(&self.known).get(&peer)?)?;
        (!crate::os::process::process_alive(pid)).then_some(pid)
    }

    /// Fails at once (`Unsupported`) when one of `peers` cannot map this rank's memory; reads
    /// the identities of those not known yet in one `WAIT` + `MULTI_GET`, waiting at most
    /// `timeout` for the peers to publish them (they do when they create their caches).
    pub fn check(
        &self,
        store: &dyn Store,
        names: &CacheNames,
        rank: usize,
        peers: &[usize],
        timeout: Duration,
    ) -> Result<()> {
        let mut unknown: Vec<usize> = peers.iter().copied().filter(|&p| !self.known(p)).collect();
        unknown.sort_unstable();
        unknown.dedup();
        if unknown.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = unknown.iter().map(|&p| names.node_key(p)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let values = store.multi_get(&refs, timeout).map_err(|e| {
            e.context(format!(
                "rank {}: waiting for peer rank(s) {unknown:?} to create their caches of {} \
                 (keys {keys:?}); do they create a cache for this job and scope, and free and \
                 re-create it as often as this rank (a rank's n-th cache of a scope talks to its \
                 peers' n-th)?",
                rank, names
            ))
        })?;
        let me = NodeIdentity::local();
        for ((peer, key), value) in unknown.iter().zip(&keys).zip(&values) {
            let node = NodeIdentity::decode(&String::from_utf8_lossy(value)).ok_or_else(|| {
                Error::protocol(format!(
                    "rank {}: store key {key} does not hold a node identity; all ranks must use \
                     the same nvfuser-ipc version",
                    rank
                ))
            })?;
            match me.reach(&node) {
                Reach::Mappable { pids } => {
                    lock(&self.known).insert(*peer, pids.then_some(node.pid));
                }
                Reach::Unmappable(why) => {
                    return Err(Error::unsupported(format!(
                        "rank {}: peer rank {peer} (pid {}) {why}. Exchange handles only \
                         between ranks of one node",
                        rank, node.pid
                    )))
                }
            }
        }
        Ok(())
    }

    /// Deletes this rank's identity key (at close).
    pub fn unpublish(&self, store: &dyn Store, names: &CacheNames, rank: usize) {
        let _ = store.delete_key(&names.node_key(rank));
    }
}
