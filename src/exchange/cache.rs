//! The handle cache: its channel table and its session, the public surface over them and the order
//! of a call (resolve the requests, then a batch: `exchange::batch`). Its teardown is in
//! `teardown.rs`, its symmetric calls in `symmetric_calls.rs`.
//!
//! Calls on *different* channels may run concurrently (the table lock is never held across a board
//! wait or a store call); a call on a channel another thread is exchanging fails (`InvalidState`).

use super::batch::{self, Batch, Deadline, Item, Resolution};
use super::board::OwnBoard;
use super::channel::{Channel, ChannelTable, OpenChannel, Request};
use super::collector::Collector;
use super::peers::PeerNodes;
use super::phases::{Phase, PhaseTimes};
use super::session::{CacheStats, Counters, Session, Settings};
use super::symmetric::SymmetricTable;
use crate::error::{Error, Result};
use crate::logging;
use crate::names::{generations, CacheNames};
use crate::node::PeerProcess;
use crate::store::Store;
use crate::sync::lock;
use crate::transport::{LocalBuffer, MemKind, P2pHandles, Transport, Transports};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What a cache needs to know about its job.
#[derive(Clone)]
pub struct CacheConfig {
    pub rank: usize,
    pub world_size: usize,
    pub store: Arc<dyn Store>,
    /// Unique per job; names the boards, shm segments and store keys.
    pub job_id: String,
    /// Distinguishes several caches of one job in one process (equal on all ranks; may be "").
    pub scope: String,
    /// Bound of every wait of an exchange (board and store), until `set_timeout`.
    pub timeout: Duration,
}

/// Buffers of one call, kept per thread and reused, so a warm exchange allocates nothing.
#[derive(Default)]
struct Scratch {
    resolved: Vec<LocalBuffer>,
    channels: Vec<usize>,
    items: Vec<Item>,
}

/// Batches larger than this do not leave their buffers behind in the thread.
const SCRATCH_KEEP: usize = 256;

thread_local! {
    // process-wide: per thread, so that a warm exchange reuses its buffers and allocates nothing.
    static SCRATCH: Cell<Scratch> = const {
        Cell::new(Scratch {
            resolved: Vec::new(),
            channels: Vec::new(),
            items: Vec::new(),
        })
    };
}

/// Exchanges and caches P2P handles between the ranks of one job.
pub struct HandleCache {
    pub(super) cx: Session,
    pub(super) table: Mutex<ChannelTable>,
    /// What each symmetric rendezvous left (members, contiguous view), by tag.
    pub(super) symmetric: Mutex<SymmetricTable>,
    /// Set by the first teardown (close, then drop, run it twice).
    pub(super) torn_down: bool,
}

impl HandleCache {
    /// A cache with the given transports (at most one per memory kind).
    pub fn with_transports(cfg: CacheConfig, list: Vec<Arc<dyn Transport>>) -> Result<HandleCache> {
        Self::new(cfg, Transports::of(list)?)
    }

    /// A cache that exchanges buffers through `transports` (for the library's own set, see
    /// `crate::default_transports`).
    pub fn new(cfg: CacheConfig, transports: Transports) -> Result<HandleCache> {
        if cfg.world_size == 0 || cfg.rank >= cfg.world_size {
            return Err(Error::invalid(format!(
                "rank {} is not in a world of {} ranks",
                cfg.rank, cfg.world_size
            )));
        }
        if cfg.world_size > u32::MAX as usize {
            return Err(Error::invalid("world size does not fit 32 bits"));
        }
        super::board::reclaim_dead();
        crate::departures::note_world(&cfg.job_id, cfg.world_size);
        let generation = generations::reserve(&cfg.job_id, &cfg.scope, cfg.rank);
        let names = CacheNames::new(&cfg.job_id, &cfg.scope, generation.generation());
        let trusted = crate::fdpass::TrustedUids::from_env()?;
        let board = OwnBoard::create(&names.board(cfg.rank), cfg.rank, trusted)
            .map_err(|e| e.context(format!("rank {}", cfg.rank)))?;
        let peer_nodes = PeerNodes::publish(&*cfg.store, &names, cfg.rank)?;
        let counters = Counters::default();
        let collector = Collector::start(cfg.store.clone(), counters.keys_deleted.clone())?;
        let settings = Arc::new(Settings::new(cfg.timeout));
        logging::set_rank(cfg.rank as i64);
        log::info!(
            target: logging::EXCHANGE,
            "rank {}: {names} created, world {}, timeout {:?}",
            cfg.rank,
            cfg.world_size,
            settings.timeout()
        );
        generation.commit();
        Ok(HandleCache {
            cx: Session {
                rank: cfg.rank,
                world_size: cfg.world_size,
                store: cfg.store,
                names,
                transports,
                board,
                peer_boards: Mutex::new(HashMap::new()),
                peer_nodes,
                holdings: Mutex::new(Default::default()),
                counters,
                collector: Mutex::new(collector),
                settings,
            },
            table: Mutex::new(ChannelTable::default()),
            symmetric: Mutex::default(),
            torn_down: false,
        })
    }

    pub fn rank(&self) -> usize {
        self.cx.rank
    }

    pub fn world_size(&self) -> usize {
        self.cx.world_size
    }

    /// The names of this cache's boards and store keys (its job, scope and generation).
    pub fn names(&self) -> &CacheNames {
        &self.cx.names
    }

    /// The transport of `kind`, if this cache has one.
    pub fn transport(&self, kind: MemKind) -> Option<&Arc<dyn Transport>> {
        self.cx.transports.get(kind)
    }

    /// The bound of every wait of [`exchange_handles`](Self::exchange_handles).
    pub fn timeout(&self) -> Duration {
        self.cx.settings.timeout()
    }

    pub fn set_timeout(&self, timeout: Duration) {
        self.cx.settings.set_timeout(timeout);
    }

    /// The bound of the teardown's wait for peers to close: as set, else min(timeout,
    /// [`DEFAULT_MAX_LINGER`](super::DEFAULT_MAX_LINGER)).
    pub fn linger(&self) -> Duration {
        self.cx.settings.linger()
    }

    /// Sets the bound of the teardown's wait for peers to close (zero: check once).
    pub fn set_linger(&self, linger: Duration) {
        self.cx.settings.set_linger(linger);
    }

    /// How many replaced peer allocations the cache keeps mapped per (peer, memory kind), so that
    /// buffers carved again from them cost no open (default [`super::DEFAULT_RETAINED_PER_PEER`]).
    pub fn retained_per_peer(&self) -> usize {
        self.cx.settings.retained_per_peer.load(Ordering::Relaxed)
    }

    /// Sets [`retained_per_peer`](Self::retained_per_peer); 0 releases every replaced mapping at
    /// once. Takes effect at the next replacement.
    pub fn set_retained_per_peer(&self, per_peer: usize) {
        self.cx
            .settings
            .retained_per_peer
            .store(per_peer, Ordering::Relaxed);
    }

    /// Counters since creation.
    pub fn stats(&self) -> CacheStats {
        self.cx.counters.snapshot()
    }

    /// Exchanges handles for a batch with the cache's timeout. Every rank named as a peer must
    /// make a matching call (same tags, any order); nothing else is synchronised.
    pub fn exchange_handles(&self, requests: &[Request]) -> Result<()> {
        self.exchange_handles_timeout(requests, self.timeout())
    }

    /// [`exchange_handles`](Self::exchange_handles) with an explicit bound on its waits.
    pub fn exchange_handles_timeout(&self, requests: &[Request], timeout: Duration) -> Result<()> {
        self.exchange_resolved_as(requests, timeout, Resolution::Shared)
    }

    /// An exchange whose buffers resolve as `resolution` says.
    pub(super) fn exchange_resolved_as(
        &self,
        requests: &[Request],
        timeout: Duration,
        resolution: Resolution,
    ) -> Result<()> {
        let mut scratch = SCRATCH.try_with(Cell::take).unwrap_or_default();
        let run = |scratch: &mut Scratch| {
            let mut lap = self.cx.counters.phases.start();
            batch::resolve_all(&self.cx, requests, resolution, &mut scratch.resolved)?;
            lap.mark(Phase::Resolve);
            let batch = Batch::begin(
                &self.cx,
                &self.table,
                requests,
                (&scratch.resolved, resolution),
                &mut scratch.channels,
                &mut scratch.items,
            )?;
            lap.mark(Phase::Claim);
            batch.exchange(&mut Deadline::new(timeout), lap)
        };
        let result = run(&mut scratch);
        if scratch.items.capacity() <= SCRATCH_KEEP {
            scratch.resolved.clear();
            scratch.channels.clear();
            scratch.items.clear();
            // Fails only while the thread exits; the buffers are then simply freed.
            let _ = SCRATCH.try_with(|cell| cell.set(scratch));
        }
        result
    }

    /// Turns the per-phase timing of exchanges on or off (off by default; on, each call reads the
    /// clock at every phase boundary). See [`phase_times`](Self::phase_times).
    pub fn set_phase_timing(&self, on: bool) {
        self.cx.counters.phases.set_enabled(on);
    }

    /// Time per phase over the calls timed since the last reset; `reset` starts over.
    pub fn phase_times(&self, reset: bool) -> PhaseTimes {
        let t = self.cx.counters.phases.snapshot();
        if reset {
            self.cx.counters.phases.reset();
        }
        t
    }

    /// The handles of the channel of `req` (as last exchanged): the request must match the
    /// pointer and size given to the last `exchange_handles` that included it.
    pub fn get(&self, req: &Request) -> Result<P2pHandles> {
        Ok(self.find(&lock(&self.table), req)?.1)
    }

    /// The channel of `req`, found as [`get`](Self::get) finds it, opened for transfers: its
    /// handles stay usable without another lookup until an exchange changes the channel's
    /// buffers or the cache is torn down (then every use is an `InvalidState` error).
    pub fn open_channel(&self, req: &Request) -> Result<OpenChannel> {
        let st = lock(&self.table);
        let (ch, handles) = self.find(&st, req)?;
        // Under the table lock, as every change of the generation.
        Ok(OpenChannel::new(
            handles,
            ch.info.clone(),
            ch.validity.clone(),
            self.cx.rank,
            self.cx.settings.clone(),
        ))
    }

    /// The channel of `req` in `st`, exchanged with the request's buffer, and its handles.
    fn find<'t>(&self, st: &'t ChannelTable, req: &Request) -> Result<(&'t Channel, P2pHandles)> {
        let rank = self.cx.rank;
        if req.peer >= self.cx.world_size || req.peer == rank {
            return Err(Error::invalid(format!(
                "rank {rank}: get({req}): peer {} is not another rank of this world of {}",
                req.peer, self.cx.world_size
            )));
        }
        let mut occ: u32 = 0;
        let mut any = false;
        while let Some(i) = st.index_of(rank, req, occ) {
            any = true;
            let ch = &st.channels[i];
            let matches = ch
                .local
                .is_some_and(|l| l.ptr == req.ptr && l.bytes == req.bytes);
            if matches && ch.info.kind == req.kind {
                if let Some(err) = &ch.failed {
                    return Err(Error::state(format!(
                        "rank {rank}: {} failed in its last exchange: {}",
                        ch.info.key, err.message
                    )));
                }
                let (Some(local), Some(peer)) = (&ch.local, &ch.peer_side) else {
                    break;
                };
                let t = self.cx.channel_transport(ch.info.kind);
                let owner = ch.progress.as_ref().and_then(|p| p.link.board.as_ref());
                let handles = P2pHandles {
                    kind: ch.info.kind,
                    local_ptr: local.ptr,
                    local_bytes: local.bytes,
                    local_semaphore: t.semaphores().local(ch.info.slot)?,
                    peer_ptr: peer.mapping.ptr(),
                    peer_bytes: peer.bytes,
                    peer_semaphore: peer.semaphore,
                    epochs: ch.epochs.clone(),
                    peer: owner.map_or(
                        PeerProcess {
                            rank: ch.info.peer,
                            pid: 0,
                            checkable: false,
                        },
                        |b| b.owner(),
                    ),
                };
                return Ok((ch, handles));
            }
            occ = occ.wrapping_add(1);
        }
        let other = if any {
            " (the channel exists but was last exchanged for another buffer)"
        } else {
            ""
        };
        Err(Error::not_found(format!(
            "rank {rank}: no handles for {req}{other}; call exchange_handles with this request \
             first"
        )))
    }
}
