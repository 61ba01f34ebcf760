//! What a batch's protocol and a cache's teardown work with: this rank's place in the job, its
//! store, names, transports, board, settings and counters, the peers' boards and node identities,
//! and what this rank holds of its peers across channels (semaphore slabs, kept mappings, known
//! allocations). It knows nothing of the channel table nor of the cache that owns it.

use super::board::{OwnBoard, PeerBoard};
use super::channel::Imported;
use super::collector::Collector;
use super::known::KnownAllocations;
use super::peers::PeerNodes;
use super::retain::Retained;
use super::settings::Settings;
use super::stats::{bump, Counters};
use crate::error::Result;
use crate::names::CacheNames;
use crate::store::Store;
use crate::sync::lock;
use crate::transport::{ExportedHandle, Mapping, MemKind, Transport, Transports};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// What this rank holds of its peers beyond one channel, under one lock.
#[derive(Default)]
pub(super) struct PeerHoldings {
    /// Peer semaphore slabs mapped by this cache, per (peer, kind).
    pub slabs: HashMap<(usize, MemKind), (ExportedHandle, u64)>,
    /// Replaced peer mappings kept mapped for reuse (see `retain`).
    pub retained: Retained,
    /// Records of peer allocations seen, for buffers that move inside them (see `known`).
    pub known: KnownAllocations,
}

pub(super) struct Context {
    pub rank: usize,
    pub world_size: usize,
    pub store: Arc<dyn Store>,
    /// The names of this cache's boards, node keys and record keys (its generation included).
    pub names: CacheNames,
    /// Handed in by the layer that builds the cache (see `Transports`).
    pub transports: Transports,
    pub board: OwnBoard,
    pub peer_boards: Mutex<HashMap<usize, Arc<PeerBoard>>>,
    pub peer_nodes: PeerNodes,
    pub holdings: Mutex<PeerHoldings>,
    pub counters: Counters,
    pub collector: Mutex<Collector>,
    /// Shared with the channels opened from the cache (their default transfer timeout).
    pub settings: Arc<Settings>,
}

impl Context {
    /// The transport of `kind`, if this cache has one.
    pub fn transport(&self, kind: MemKind) -> Option<&Arc<dyn Transport>> {
        self.transports.get(kind)
    }

    /// The transport of a channel's kind (a channel is only created with one).
    pub fn channel_transport(&self, kind: MemKind) -> &Arc<dyn Transport> {
        self.transport(kind).expect("channel kinds have transports")
    }

    /// `peer`'s board, opened on first use; `None` while it has none on this node.
    pub fn peer_board(&self, peer: usize) -> Result<Option<Arc<PeerBoard>>> {
        if let Some(b) = lock(&self.peer_boards).get(&peer) {
            return Ok(Some(b.clone()));
        }
        let name = self.names.board(peer);
        let Some(board) = PeerBoard::try_open(&name, peer)? else {
            return Ok(None);
        };
        let board = Arc::new(board);
        lock(&self.peer_boards).insert(peer, board.clone());
        // So that whoever closes after this peer can see it has left (see `departures`).
        crate::departures::note_peer(self.names.job_id(), peer, board.clone());
        Ok(Some(board))
    }

    /// Whether `peer` can no longer map this rank's memory: it marked its board closed, its
    /// process has exited, or no live board of it can be found (it never created its cache, its
    /// board was removed, or it belongs to a dead process). A board of another layout belongs to
    /// an incompatible version, which could never have exchanged with this one.
    pub fn peer_let_go(&self, peer: usize) -> bool {
        match self.peer_board(peer) {
            Ok(Some(b)) => b.closed() || !b.owner_alive(),
            Ok(None) | Err(_) => true,
        }
    }

    pub fn release_mapping(&self, kind: MemKind, m: &Mapping) {
        if let Some(t) = self.transport(kind) {
            // A failed release means the mapping is already gone; count it as closed anyway
            // so the balance reflects what this cache asked for.
            let _ = t.release(m);
            bump(&self.counters.closes, 1);
        }
    }

    pub fn release_imports(&self, imports: Vec<Option<Imported>>) {
        for imp in imports.into_iter().flatten() {
            self.release_mapping(imp.kind, &imp.mapping);
        }
    }
}
