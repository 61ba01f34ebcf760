//! What a batch's protocol and a cache's teardown work with (everything but the channel table),
//! the cache's tunables ([`Settings`]) and counters ([`CacheStats`], which the C ABI hands out as
//! it is: build.rs feeds this file to cbindgen).

use super::board::{OwnBoard, PeerBoard};
use super::collector::Collector;
use super::held::HeldMapping;
use super::peers::{PeerHoldings, PeerNodes, DEFAULT_RETAINED_PER_PEER};
use super::phases::PhaseClock;
use crate::error::Result;
use crate::names::CacheNames;
use crate::store::Store;
use crate::sync::lock;
use crate::transport::record::Record;
use crate::transport::{ExportedHandle, MemKind, PeerMapping, Transport, Transports};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(super) struct Session {
    pub rank: usize,
    pub world_size: usize,
    pub store: Arc<dyn Store>,
    /// The names of this cache's boards, node keys and record keys (its generation included).
    pub names: CacheNames,
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

impl Session {
    /// The transport of a channel's kind (a channel is only created with one).
    pub fn channel_transport(&self, kind: MemKind) -> &Arc<dyn Transport> {
        self.transports
            .get(kind)
            .expect("channel kinds have transports")
    }

    /// `peer`'s board, opened on first use; `None` while it has none on this node.
    pub fn peer_board(&self, peer: usize) -> Result<Option<Arc<PeerBoard>>> {
        if let Some(b) = lock(&self.peer_boards).get(&peer) {
            return Ok(Some(b.clone()));
        }
        let name = self.names.board(peer);
        let Some(board) = PeerBoard::try_open(&name, peer, self.board.trusted())? else {
            return Ok(None);
        };
        self.board.check_guarded(&board);
        let board = Arc::new(board);
        lock(&self.peer_boards).insert(peer, board.clone());
        // So that whoever closes after this peer can see it has left (see `departures`).
        crate::departures::note_peer(self.names.job_id(), peer, board.clone());
        Ok(Some(board))
    }

    /// Whether `peer` can no longer map this rank's memory: it marked its board closed, its
    /// process has exited, or no live board of it (of this version) can be found.
    pub fn peer_let_go(&self, peer: usize) -> bool {
        match self.peer_board(peer) {
            Ok(Some(b)) => b.closed() || b.owner().is_dead(),
            Ok(None) | Err(_) => true,
        }
    }
}

/// A peer buffer opened by a call, not yet installed in its channel.
pub(super) struct Imported {
    pub mapping: HeldMapping,
    pub bytes: u64,
    pub sem_handle: ExportedHandle,
    pub sem_slot: u32,
    /// The peer's semaphore for the channel as mapped here; set by `map_peer_slabs` before the
    /// peer is told the buffer is opened (0 until then).
    pub semaphore: u64,
    pub record: Record,
}

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
    pub(super) retained_per_peer: AtomicUsize,
}

impl Settings {
    pub(super) fn new(timeout: Duration) -> Settings {
        Settings {
            timeout_ns: AtomicU64::new(nanos(timeout)),
            linger_ns: AtomicU64::new(LINGER_FROM_TIMEOUT),
            retained_per_peer: AtomicUsize::new(DEFAULT_RETAINED_PER_PEER),
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
}

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

/// The live counters: one atomic per field of [`CacheStats`], and the phase clock.
macro_rules! counters {
    ($($name:ident),*) => {
        #[derive(Default)]
        pub(crate) struct Counters {
            $(pub(crate) $name: AtomicU64,)*
            /// Shared with the collector's thread.
            pub(crate) keys_deleted: Arc<AtomicU64>,
            /// Shared with the mappings held ([`HeldMapping`]).
            pub(crate) closes: Arc<AtomicU64>,
            /// Time per phase of a call, when asked for.
            pub(crate) phases: PhaseClock,
        }

        impl Counters {
            pub(crate) fn snapshot(&self) -> CacheStats {
                CacheStats {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    keys_deleted: self.keys_deleted.load(Ordering::Relaxed),
                    closes: self.closes.load(Ordering::Relaxed),
                }
            }
        }
    };
}

counters! {
    exchanges, hits, misses, store_round_trips, records_sent, record_bytes_sent, records_received,
    opens, peers_unclosed, leaked_slabs, peer_lookups, records_known
}

pub(crate) fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl Counters {
    /// `mapping`, counted as one open now and one close when the result is dropped.
    pub(crate) fn hold(&self, mapping: PeerMapping) -> HeldMapping {
        bump(&self.opens, 1);
        HeldMapping::counted(mapping, Arc::clone(&self.closes))
    }
}
