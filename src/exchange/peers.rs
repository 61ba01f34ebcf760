//! What this rank knows and holds of its peers: their nodes ([`PeerNodes`]: a peer that can never
//! have a board here is refused at once), the records of peer allocations imported
//! ([`KnownAllocations`]) and, per channel, those listed on its board entry ([`HeldRecords`]): a
//! buffer carved from one (PyTorch's caching allocator) is imported with no store wait, or no
//! record at all (docs/PROTOCOL.md, section 4); the peers' semaphore slabs mapped here; and replaced
//! mappings ([`Retained`], a bounded set of guards: a buffer moving back costs a reference, not a
//! driver open). Allocation ids are never reused within
//! a process and records are keyed by the exporter's pid too.

use super::board::{PeerBoard, KNOWN_PER_CHANNEL};
use super::held::HeldMapping;
use crate::departures::Presence;
use crate::error::{Error, Result};
use crate::fdpass::TrustedUids;
use crate::names::CacheNames;
use crate::node::{NodeIdentity, Reach};
use crate::store::Store;
use crate::sync::lock;
use crate::transport::record::Record;
use crate::transport::{ExportedHandle, MemKind, PeerMapping};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

/// This rank's view of its peers' nodes.
#[derive(Default)]
pub(super) struct PeerNodes {
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
        Ok(PeerNodes::default())
    }

    /// True when `peer` was already found mappable (no store traffic).
    pub fn known(&self, peer: usize) -> bool {
        lock(&self.known).contains_key(&peer)
    }

    /// The pid of `peer`'s process, as its cache published it, when that process has exited and
    /// its pid can be checked from here.
    pub fn exited(&self, peer: usize) -> Option<u32> {
        let pid = (*lock(&self.known).get(&peer)?)?;
        (!crate::os::process::process_alive(pid)).then_some(pid)
    }

    /// Fails at once (`Unsupported`) when one of `peers` cannot map this rank's memory, reading
    /// the identities of those not known yet in one `WAIT` + `MULTI_GET`.
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
                "rank {rank}: waiting for peer rank(s) {unknown:?} to create their caches of \
                 {names} (keys {keys:?}); do they create a cache for this job and scope, and free \
                 and re-create it as often as this rank (a rank's n-th cache of a scope talks to \
                 its peers' n-th)?"
            ))
        })?;
        let me = NodeIdentity::local();
        for ((peer, key), value) in unknown.iter().zip(&keys).zip(&values) {
            if value.is_empty() {
                return Err(deleted_node_key(rank, *peer, key, names));
            }
            let node = NodeIdentity::decode(&String::from_utf8_lossy(value)).ok_or_else(|| {
                Error::protocol(format!(
                    "rank {rank}: store key {key} does not hold a node identity; all ranks must \
                     use the same nvfuser-ipc version"
                ))
            })?;
            match me.reach(&node) {
                Reach::Mappable { pids } => {
                    lock(&self.known).insert(*peer, pids.then_some(node.pid));
                }
                Reach::Unmappable(why) => {
                    return Err(Error::unsupported(format!(
                        "rank {rank}: peer rank {peer} (pid {}) {why}. Exchange handles only \
                         between ranks of one node",
                        node.pid
                    )))
                }
            }
        }
        Ok(())
    }
}

/// The error of a peer whose node key was deleted between this rank's wait for it and its read
/// (a store reads a missing key as empty): the peer closed that cache or exited, as its board
/// tells when one is still here.
fn deleted_node_key(rank: usize, peer: usize, key: &str, names: &CacheNames) -> Error {
    // Only on this error path, so the job's setting is read here rather than carried along.
    let trusted = TrustedUids::from_env().unwrap_or_else(|_| TrustedUids::own());
    let board = PeerBoard::try_open(&names.board(peer), peer, &trusted)
        .ok()
        .flatten();
    let seen = match (board.as_ref().and_then(|b| b.left()), board.is_some()) {
        (Some(why), _) => why,
        (None, true) => format!("its board is open: rank {peer} may be creating the cache again"),
        (None, false) => "no live board of it is here".to_string(),
    };
    Error::state(format!(
        "rank {rank}: peer rank {peer} deleted its node key {key} as this rank read it: it closed \
         its cache of {names} or exited ({seen}); a closed cache takes no part in exchanges: \
         create new caches on both ranks, or find out why rank {peer} left"
    ))
}

/// What this rank holds of its peers beyond one channel, under one lock.
#[derive(Default)]
pub(super) struct PeerHoldings {
    /// Peer semaphore slabs mapped by this cache, per (peer, kind), with the handle they came from.
    pub slabs: HashMap<(usize, MemKind), (ExportedHandle, HeldMapping)>,
    /// Replaced peer mappings kept mapped for reuse.
    pub retained: Retained,
    /// Records of peer allocations seen, for buffers that move inside them.
    pub known: KnownAllocations,
}

/// Allocation records kept per cache before the table starts over (which costs only fetches).
const MAX_KNOWN: usize = 4096;

/// (peer rank, exporter pid, memory kind, allocation id).
type Key = (usize, u32, MemKind, u64);

/// Peer allocation records by allocation.
#[derive(Default)]
pub(super) struct KnownAllocations {
    records: HashMap<Key, Record>,
}

impl KnownAllocations {
    /// Remembers the allocation that `rec` (imported from `peer`) describes.
    pub fn learn(&mut self, peer: usize, kind: MemKind, rec: &Record) {
        if self.records.len() >= MAX_KNOWN {
            self.records.clear();
        }
        self.records
            .insert((peer, rec.pid, kind, rec.buffer_id), rec.clone());
    }

    /// [`record_at`] in the kept record of allocation `key`.
    pub fn record_for(
        &self,
        key: Key,
        offset: u64,
        bytes: u64,
        version: u64,
        channel: &Record,
    ) -> Option<Record> {
        record_at(self.records.get(&key)?, offset, bytes, version, channel)
    }
}

/// The record of version `version` of a buffer at `[offset, offset + bytes)` of the allocation
/// that `known` describes, with the semaphore of the channel's own last record `channel`. `None`
/// when the place does not fit in the allocation or `channel` is of another process or rank.
fn record_at(
    known: &Record,
    offset: u64,
    bytes: u64,
    version: u64,
    channel: &Record,
) -> Option<Record> {
    let fits = bytes > 0
        && offset
            .checked_add(bytes)
            .is_some_and(|e| e <= known.alloc_bytes);
    if !fits || channel.pid != known.pid || channel.rank != known.rank {
        return None;
    }
    Some(Record {
        offset,
        bytes,
        version,
        sem_type: channel.sem_type,
        sem_slot: channel.sem_slot,
        sem_payload: channel.sem_payload,
        ..known.clone()
    })
}

/// The records of the peer's allocations one channel's importer holds, most recent first.
#[derive(Default)]
pub(super) struct HeldRecords {
    records: Vec<Record>,
}

impl HeldRecords {
    /// As [`KnownAllocations::record_for`], from the records held for the channel.
    pub fn record_for(
        &self,
        alloc_id: u64,
        offset: u64,
        bytes: u64,
        version: u64,
        channel: &Record,
    ) -> Option<Record> {
        let known = self.records.iter().find(|r| r.buffer_id == alloc_id)?;
        record_at(known, offset, bytes, version, channel)
    }

    /// After the import of `rec`: keeps the records the board still lists (`listed`), puts `rec`'s
    /// first and bounds the list. Returns the allocation ids to list on the board now.
    pub fn imported(&mut self, listed: &[u64], rec: &Record) -> Vec<u64> {
        let held = self
            .records
            .iter()
            .position(|r| r.buffer_id == rec.buffer_id);
        match held {
            // The pool pattern: an allocation held already moves first, with no clone unless
            // its pieces differ (VMM runs mapped for another range).
            Some(i) => {
                self.records[..=i].rotate_right(1);
                if self.records[0].segments != rec.segments {
                    self.records[0] = rec.clone();
                }
            }
            None => self.records.insert(0, rec.clone()),
        }
        let mut first = true;
        self.records
            .retain(|r| std::mem::take(&mut first) || listed.contains(&r.buffer_id));
        self.records.truncate(KNOWN_PER_CHANNEL);
        self.records.iter().map(|r| r.buffer_id).collect()
    }
}

/// Default number of distinct peer allocations kept per (peer, memory kind) and cache.
pub const DEFAULT_RETAINED_PER_PEER: usize = 8;

/// The replaced mappings a cache keeps (one guard per allocation), per (peer, kind), oldest
/// first.
#[derive(Default)]
pub(super) struct Retained {
    kept: HashMap<(usize, MemKind), VecDeque<HeldMapping>>,
}

fn same_allocation(a: &PeerMapping, b: &PeerMapping) -> bool {
    a.peer() == b.peer() && a.buffer_id() == b.buffer_id() && a.base() == b.base()
}

impl Retained {
    /// Keeps replaced mapping `m`; returns the guards to drop now (`m` when its allocation is
    /// kept already or `limit` is zero, else the oldest beyond `limit`).
    pub fn retire(&mut self, kind: MemKind, m: HeldMapping, limit: usize) -> Vec<HeldMapping> {
        if limit == 0 {
            return vec![m];
        }
        let list = self.kept.entry((m.peer(), kind)).or_default();
        if let Some(i) = list.iter().position(|k| same_allocation(k, &m)) {
            // Most recently replaced now; one guard of the allocation is enough.
            let kept = list.remove(i).expect("index from position");
            list.push_back(kept);
            return vec![m];
        }
        list.push_back(m);
        let excess = list.len().saturating_sub(limit);
        list.drain(..excess).collect()
    }

    /// Whether a mapping of `m`'s allocation is kept.
    pub fn holds(&self, kind: MemKind, m: &PeerMapping) -> bool {
        self.kept
            .get(&(m.peer(), kind))
            .is_some_and(|list| list.iter().any(|k| same_allocation(k, m)))
    }
}

#[cfg(test)]
mod tests;
