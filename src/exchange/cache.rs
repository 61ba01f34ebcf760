//! The handle cache: its channel table and its session, the public surface over them, the order
//! of a call (resolve the requests, then a batch: `exchange::batch`) and its teardown.
//!
//! Calls on *different* channels may run concurrently (the table lock is never held across a board
//! wait or a store call); a call on a channel another thread is exchanging fails (`InvalidState`).
//! Teardown never frees what a peer may still map (docs/PROTOCOL.md, "Closing a cache").

use super::batch::{self, Batch, Deadline, Item, Resolution};
use super::board::OwnBoard;
use super::channel::{Channel, ChannelTable, OpenChannel, Request};
use super::collector::Collector;
use super::peers::PeerNodes;
use super::phases::{Phase, PhaseTimes};
use super::session::{bump, CacheStats, Counters, Session, Settings};
use super::symmetric::{
    member_id, not_rendezvoused, requests, HeldView, MemberId, PeerBuffer, Rendezvous,
    SymmetricTable,
};
use crate::barrier::MemberSet;
use crate::departures;
use crate::error::{Error, Result};
use crate::logging;
use crate::names::{generations, CacheNames};
use crate::node::PeerProcess;
use crate::os::wait::{wait_paced, SLEEPING};
use crate::store::Store;
use crate::sync::lock;
use crate::transport::view::ViewMember;
use crate::transport::{LocalBuffer, MemKind, P2pHandles, Transport, Transports};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    torn_down: bool,
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
        let board = OwnBoard::create(&names.board(cfg.rank), cfg.rank)
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

// Symmetric memory (see `symmetric`): a rendezvous is one exchange of the group's pairs.
impl HandleCache {
    /// Maps every other member's buffer of a symmetric allocation: `ptr`/`bytes` is this rank's
    /// buffer, `group` the ranks taking part (the whole world when `None`; it must contain this
    /// rank), `tag` names the allocation (equal on every member). Returns one entry per member in
    /// increasing rank order, this rank's own included. Each rank waits only for the peers it
    /// maps; members may call in any order and other ranks are not involved. A second rendezvous
    /// of the same buffers is free.
    pub fn symmetric_rendezvous(
        &self,
        tag: &str,
        ptr: u64,
        bytes: u64,
        kind: MemKind,
        group: Option<&[usize]>,
        timeout: Duration,
    ) -> Result<Vec<PeerBuffer>> {
        let rank = self.rank();
        let group = MemberSet::new(rank, self.world_size(), group)
            .map_err(|e| e.context(format!("symmetric rendezvous {tag:?}")))?;
        if tag.is_empty() {
            return Err(Error::invalid(
                "symmetric rendezvous: the tag is empty; name the allocation (equal on every \
                 member)",
            ));
        }
        let reqs = requests(rank, &group, tag, ptr, bytes, kind);
        self.exchange_resolved_as(&reqs, timeout, Resolution::Exact)
            .map_err(|e| e.context(format!("symmetric rendezvous {tag:?}")))?;
        let members = group.ranks().to_vec();
        lock(&self.symmetric).record(
            tag,
            Rendezvous {
                kind,
                ptr,
                bytes,
                members,
                view: None,
            },
        );
        let mut peers = reqs.iter();
        let mut buffer = |member: usize| {
            if member == rank {
                return Ok(PeerBuffer { rank, ptr, bytes });
            }
            let h = self.get(peers.next().expect("one request per other member"))?;
            let (rank, ptr, bytes) = (member, h.peer_ptr, h.peer_bytes);
            Ok(PeerBuffer { rank, ptr, bytes })
        };
        group.ranks().iter().map(|&m| buffer(m)).collect()
    }

    /// Maps every member's buffer of the last rendezvous of `tag` again, in increasing rank
    /// order, into one reserved range: member i's buffer is at `base + i * stride` (returned as
    /// `(base, stride)`). The view is the cache's: asking again returns the same one, until a
    /// rendezvous of `tag` with other buffers, [`symmetric_release`](Self::symmetric_release) or
    /// the cache's end. Every member's buffer must have the same size and the same offset in its
    /// allocation granule (`InvalidArgument` names those that differ); device buffers must be VMM
    /// allocations (`Unsupported` otherwise).
    pub fn symmetric_contiguous_view(&self, tag: &str) -> Result<(u64, u64)> {
        let what = || format!("rank {}: contiguous view of {tag:?}", self.rank());
        let mut table = lock(&self.symmetric);
        let r = table
            .tags
            .get_mut(tag)
            .ok_or_else(|| not_rendezvoused(self.rank(), tag))?;
        let group = MemberSet::new(self.rank(), self.world_size(), Some(&r.members))?;
        let reqs = requests(self.rank(), &group, tag, r.ptr, r.bytes, r.kind);
        let t = self.cx.transports.get_or_make(r.kind)?;
        // Resolved again: a buffer freed since the rendezvous is refused, not mapped.
        let own = t.resolve(r.ptr, r.bytes).map_err(|e| e.context(what()))?;
        let peers = lock(&self.table)
            .peer_buffers(self.rank(), &reqs, tag)
            .map_err(|e| e.context(what()))?;
        let mut peer = peers.iter();
        let parts: Vec<ViewMember<'_>> = r
            .members
            .iter()
            .map(|&rank| match rank == self.rank() {
                true => ViewMember::Own { rank, buffer: own },
                false => {
                    let (record, mapping) = peer.next().expect("one request per other member");
                    ViewMember::Peer {
                        rank,
                        record,
                        mapping,
                    }
                }
            })
            .collect();
        let ids: Vec<MemberId> = parts.iter().map(member_id).collect();
        if let Some(held) = &r.view {
            if held.ids == ids {
                return Ok((held.view.base(), held.view.stride()));
            }
        }
        // The buffers changed since the view was made: it goes before the new one is made.
        r.view = None;
        let view = t.contiguous_view(&parts).map_err(|e| e.context(what()))?;
        let out = (view.base(), view.stride());
        r.view = Some(HeldView { ids, view });
        Ok(out)
    }

    /// Drops, in this process, what the rendezvous of `tag` mapped: its contiguous view and the
    /// guards of the peers' buffers (a mapping another channel shares stays). Local
    /// only: no store traffic, no waiting for peers. The pointers of the rendezvous and the view
    /// are invalid afterwards; a later rendezvous of `tag`, with the same buffers or others,
    /// works whatever the order in which the members released and came back.
    /// `InvalidArgument` when `tag` was not rendezvoused (or is released already).
    pub fn symmetric_release(&self, tag: &str) -> Result<()> {
        let mut table = lock(&self.symmetric);
        let r = table
            .tags
            .get(tag)
            .ok_or_else(|| not_rendezvoused(self.rank(), tag))?;
        let group = MemberSet::new(self.rank(), self.world_size(), Some(&r.members))?;
        let reqs = requests(self.rank(), &group, tag, r.ptr, r.bytes, r.kind);
        // The view goes first: it maps the memory of the imports released next.
        drop(table.tags.get_mut(tag).and_then(|r| r.view.take()));
        lock(&self.table)
            .release_peers(&self.cx, &reqs, tag)
            .map_err(|e| e.context(format!("releasing symmetric allocation {tag:?}")))?;
        table.tags.remove(tag);
        Ok(())
    }

    /// Number of contiguous views this cache holds.
    pub fn symmetric_views(&self) -> usize {
        lock(&self.symmetric).views()
    }
}
