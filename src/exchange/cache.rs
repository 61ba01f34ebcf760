//! The handle cache: its channel table, its transports and settings, and the parts of a call
//! that hold the table's lock (step 1, claiming and advancing the channels; step 5, installing
//! what the call opened). The protocol between them is in `exchange::protocol`, the teardown
//! in `exchange::teardown`.
//!
//! Thread safety: every method takes `&self`. Calls on *different* channels may run concurrently
//! from several threads (the table lock is never held across a board wait or a store call); a call
//! that includes a channel already being exchanged by another thread fails with `InvalidState`.
//! `get` and `stats` may run at any time.

use super::board::{OwnBoard, PeerBoard};
use super::channel::{Channel, ChannelInfo, ChannelTable, Identity, Imported, PeerSide, Resume};
use super::collector::Collector;
use super::deadline::Deadline;
use super::events;
use super::peers::PeerNodes;
use super::protocol::{Item, RunError};
use super::request::{fingerprint_of, occurrence, ChannelKey, Request};
use super::settings::Settings;
use super::stats::{bump, CacheStats, Counters};
use crate::error::{Error, Result};
use crate::logging;
use crate::names::{generations, CacheNames};
use crate::node::PeerProcess;
use crate::store::Store;
use crate::sync::lock;
use crate::transport::{
    slot_address, ExportedHandle, LocalBuffer, Mapping, MemKind, P2pHandles, Transport, Transports,
};
use std::cell::Cell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub use super::settings::DEFAULT_MAX_LINGER;
pub use super::teardown::teardowns_timed_out;

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
    /// Bound of every wait of an exchange (board and store).
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
    pub(super) cfg: CacheConfig,
    /// The names of this cache's boards, node keys and record keys (its generation included).
    pub(super) names: CacheNames,
    /// Handed in by the layer that builds the cache (see `Transports`).
    pub(super) transports: Transports,
    pub(super) board: OwnBoard,
    pub(super) peer_boards: Mutex<HashMap<usize, Arc<PeerBoard>>>,
    pub(super) peer_nodes: PeerNodes,
    pub(super) table: Mutex<ChannelTable>,
    pub(super) counters: Counters,
    pub(super) collector: Mutex<Collector>,
    settings: Settings,
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
        let generation = generations::reserve(&cfg.job_id, &cfg.scope, cfg.rank);
        let names = CacheNames::new(&cfg.job_id, &cfg.scope, generation.generation());
        let board = OwnBoard::create(&names.board(cfg.rank), cfg.rank)
            .map_err(|e| e.context(format!("rank {}", cfg.rank)))?;
        let peer_nodes = PeerNodes::publish(&*cfg.store, &names, cfg.rank)?;
        let counters = Counters::default();
        let collector = Collector::start(cfg.store.clone(), counters.keys_deleted.clone())?;
        let settings = Settings::new(cfg.timeout);
        logging::set_rank(cfg.rank as i64);
        log::info!(
            target: logging::EXCHANGE,
            "rank {}: {names} created, world {}, timeout {:?}",
            cfg.rank,
            cfg.world_size,
            cfg.timeout
        );
        generation.commit();
        Ok(HandleCache {
            cfg,
            names,
            transports,
            board,
            peer_boards: Mutex::new(HashMap::new()),
            peer_nodes,
            table: Mutex::new(ChannelTable::default()),
            counters,
            collector: Mutex::new(collector),
            settings,
            torn_down: false,
        })
    }

    /// Adds (or replaces before first use) the transport of its memory kind, e.g. the device one.
    pub fn with_transport(mut self, t: Arc<dyn Transport>) -> Result<HandleCache> {
        if !lock(&self.table).channels.is_empty() {
            return Err(Error::state(
                "transports must be set before the first exchange",
            ));
        }
        self.transports.set(t);
        Ok(self)
    }

    pub fn rank(&self) -> usize {
        self.cfg.rank
    }

    pub fn world_size(&self) -> usize {
        self.cfg.world_size
    }

    /// The names of this cache's boards and store keys (its job, scope and generation).
    pub fn names(&self) -> &CacheNames {
        &self.names
    }

    /// The transport of `kind`, if this cache has one.
    pub fn transport(&self, kind: MemKind) -> Option<&Arc<dyn Transport>> {
        self.transports.get(kind)
    }

    /// The bound of every wait of [`exchange_handles`](Self::exchange_handles).
    pub fn timeout(&self) -> Duration {
        self.settings.timeout()
    }

    pub fn set_timeout(&self, timeout: Duration) {
        self.settings.set_timeout(timeout);
    }

    /// The bound of the teardown's wait for peers to close: the value given to
    /// [`set_linger`](Self::set_linger), else min([`timeout`](Self::timeout),
    /// [`DEFAULT_MAX_LINGER`]).
    pub fn linger(&self) -> Duration {
        self.settings.linger()
    }

    /// Sets the bound of the teardown's wait for peers to close (zero: check once).
    pub fn set_linger(&self, linger: Duration) {
        self.settings.set_linger(linger);
    }

    /// How many replaced peer allocations the cache keeps mapped per (peer, memory kind), so that
    /// buffers carved again from them cost no open (default
    /// [`DEFAULT_RETAINED_PER_PEER`](super::retain::DEFAULT_RETAINED_PER_PEER)).
    pub fn retained_per_peer(&self) -> usize {
        self.settings.retained_per_peer()
    }

    /// Sets [`retained_per_peer`](Self::retained_per_peer); 0 releases every replaced mapping at
    /// once. Takes effect at the next replacement.
    pub fn set_retained_per_peer(&self, per_peer: usize) {
        self.settings.set_retained_per_peer(per_peer);
    }

    /// Counters since creation.
    pub fn stats(&self) -> CacheStats {
        self.counters.snapshot()
    }

    /// Exchanges handles for a batch with the cache's timeout. Every rank named as a peer must
    /// make a matching call (same tags, any order); nothing else is synchronised.
    pub fn exchange_handles(&self, requests: &[Request]) -> Result<()> {
        self.exchange_handles_timeout(requests, self.timeout())
    }

    /// [`exchange_handles`](Self::exchange_handles) with an explicit bound on its waits.
    pub fn exchange_handles_timeout(&self, requests: &[Request], timeout: Duration) -> Result<()> {
        let mut scratch = SCRATCH.try_with(Cell::take).unwrap_or_default();
        let result = self.exchange_with(requests, timeout, &mut scratch);
        if scratch.items.capacity() <= SCRATCH_KEEP {
            scratch.resolved.clear();
            scratch.channels.clear();
            scratch.items.clear();
            // Fails only while the thread exits; the buffers are then simply freed.
            let _ = SCRATCH.try_with(|cell| cell.set(scratch));
        }
        result
    }

    fn exchange_with(
        &self,
        requests: &[Request],
        timeout: Duration,
        scratch: &mut Scratch,
    ) -> Result<()> {
        let mut deadline = Deadline::new(timeout);
        self.resolve_all(requests, &mut scratch.resolved)?;
        let items = &mut scratch.items;
        self.begin(requests, &scratch.resolved, &mut scratch.channels, items)?;
        // A cached call is logged at TRACE, one that moved records (or failed) at INFO.
        let clock = events::clock(log::Level::Info);
        let result = self.run(items, &mut deadline);
        match result {
            Ok(imports) => {
                let opened = imports.iter().filter(|i| i.is_some()).count();
                let replaced = self.commit(items, imports);
                bump(&self.counters.exchanges, 1);
                if clock.is_some() {
                    self.log_done(items, opened, replaced, events::since(clock));
                }
                self.wait_release_room(items, replaced, &mut deadline)
            }
            Err(RunError::NotReady(err, imports)) => {
                self.suspend(items, imports);
                log::info!(
                    target: logging::EXCHANGE,
                    "rank {}: exchange of {} channel(s) suspended after {}, resumable with \
                     the same batch: {}",
                    self.cfg.rank,
                    items.len(),
                    events::since(clock),
                    err.message
                );
                Err(err)
            }
            Err(RunError::Fatal(err)) => {
                self.fail(items, &err);
                log::info!(
                    target: logging::EXCHANGE,
                    "rank {}: exchange of {} channel(s) failed after {}, its channels are \
                     unusable: {}",
                    self.cfg.rank,
                    items.len(),
                    events::since(clock),
                    err.message
                );
                Err(err)
            }
        }
    }

    fn log_done(&self, items: &[Item], opened: usize, released: usize, took: String) {
        let published = items.iter().filter(|it| it.publish).count();
        let level = if published + opened + released == 0 {
            log::Level::Trace
        } else {
            log::Level::Info
        };
        log::log!(
            target: logging::EXCHANGE,
            level,
            "rank {}: exchange of {} channel(s) done in {took}: {published} published, \
             {opened} opened, {released} released{}",
            self.cfg.rank,
            items.len(),
            match items.first() {
                Some(it) => format!(" (first: {} step {} version {})", it.ch.key, it.step, it.version),
                None => String::new(),
            }
        );
    }

    /// Checks every request and resolves its buffer into `out`; nothing is changed on failure.
    fn resolve_all(&self, requests: &[Request], out: &mut Vec<LocalBuffer>) -> Result<()> {
        for (i, r) in requests.iter().enumerate() {
            let local = self
                .resolve(r)
                .map_err(|e| e.context(format!("rank {}: request {i} ({r})", self.cfg.rank)))?;
            out.push(local);
        }
        Ok(())
    }

    fn resolve(&self, r: &Request) -> Result<LocalBuffer> {
        if r.peer >= self.cfg.world_size {
            return Err(Error::invalid(format!(
                "peer {} is not a rank of this world of {}",
                r.peer, self.cfg.world_size
            )));
        }
        if r.peer == self.cfg.rank {
            return Err(Error::invalid(
                "peer is this rank: send/recv to self is not supported (copy locally instead)",
            ));
        }
        if r.ptr == 0 {
            return Err(Error::invalid("buffer pointer is NULL"));
        }
        if r.bytes == 0 {
            return Err(Error::invalid("byte count is 0"));
        }
        self.transports.get_or_make(r.kind)?.resolve(r.ptr, r.bytes)
    }

    /// Step 1: claims the channels of the batch and advances their step (and version).
    fn begin(
        &self,
        requests: &[Request],
        resolved: &[LocalBuffer],
        indices: &mut Vec<usize>,
        items: &mut Vec<Item>,
    ) -> Result<()> {
        let rank = self.cfg.rank;
        let mut st = lock(&self.table);
        // Pass 1: find or create every channel and check it can be used; no step moves yet.
        for (n, r) in requests.iter().enumerate() {
            let occ = occurrence(requests, n);
            let fp = fingerprint_of(rank, r, occ);
            let idx = match st.by_fp.get(&fp) {
                Some(&i) => {
                    let key = &st.channels[i].info.key;
                    if !key.is_of(rank, r, occ) {
                        return Err(Error::state(format!(
                            "rank {rank}: {} has the board fingerprint of {key}; the board cannot \
                             tell them apart: use another tag",
                            ChannelKey::of(rank, r, occ)
                        )));
                    }
                    i
                }
                None => {
                    let key = ChannelKey::of(rank, r, occ);
                    let i = self.create_channel(&mut st, r, key, fp)?;
                    st.by_fp.insert(fp, i);
                    i
                }
            };
            let ch = &st.channels[idx];
            if let Some(err) = &ch.failed {
                return Err(Error::state(format!(
                    "rank {}: {} failed earlier ({}); its state is unknown: create a new cache",
                    self.cfg.rank, ch.info.key, err.message
                )));
            }
            if ch.busy {
                return Err(Error::state(format!(
                    "rank {}: {} is being exchanged by another thread; calls on the same \
                     channel must not overlap",
                    self.cfg.rank, ch.info.key
                )));
            }
            if ch.info.kind != r.kind {
                return Err(Error::invalid(format!(
                    "rank {}: {} was used with {} memory and now with {}: a channel keeps its \
                     memory kind (use another tag)",
                    self.cfg.rank,
                    ch.info.key,
                    ch.info.kind.name(),
                    r.kind.name()
                )));
            }
            indices.push(idx);
        }
        // A suspended step resumes with the buffer it started with.
        for (&idx, local) in indices.iter().zip(resolved) {
            let ch = &st.channels[idx];
            if ch.resume.is_some() && ch.identity != Some(Identity::of(local)) {
                return Err(Error::invalid(format!(
                    "rank {}: {} timed out waiting for its peer at step {} and must be resumed \
                     with the same buffer; call again with the buffer of that call",
                    self.cfg.rank, ch.info.key, ch.step
                )));
            }
        }
        // Pass 2: advance (or resume).
        for (&idx, &local) in indices.iter().zip(resolved) {
            let ch = &mut st.channels[idx];
            let resume = ch.resume.take();
            if resume.is_none() {
                let identity = Identity::of(&local);
                if ch.identity != Some(identity) {
                    ch.identity = Some(identity);
                    ch.version += 1;
                }
                ch.step += 1;
            }
            ch.local = Some(local);
            ch.busy = true;
            let (publish, sent, staged) = match resume {
                Some(r) => (r.publish, r.sent, r.staged),
                None => (ch.version != ch.published, false, None),
            };
            items.push(Item {
                channel: idx,
                ch: ch.info.clone(),
                step: ch.step,
                version: ch.version,
                local,
                publish,
                peer_opened: ch.peer_opened,
                // Moved, not cloned: the channel is this call's until commit or suspend puts
                // it back.
                link: std::mem::take(&mut ch.link),
                peer_version: 0,
                peer_at: Default::default(),
                waiting: false,
                sent,
                staged,
            });
        }
        Ok(())
    }

    fn create_channel(
        &self,
        st: &mut ChannelTable,
        r: &Request,
        key: ChannelKey,
        fp: u128,
    ) -> Result<usize> {
        let t = self.transport(r.kind).expect("checked by resolve");
        let entry = self.board.insert(fp)?;
        let slot = t.semaphores().allocate_slot()?;
        st.channels.push(Channel::new(ChannelInfo {
            key,
            peer: r.peer,
            kind: r.kind,
            slot,
            entry,
            fp,
        }));
        Ok(st.channels.len() - 1)
    }

    /// A call that timed out waiting for a peer: its channels keep their step, version and
    /// what was opened, for the next call with the same batch to resume.
    fn suspend(&self, items: &mut [Item], imports: Vec<Option<Imported>>) {
        let mut st = lock(&self.table);
        let mut imports = imports.into_iter();
        for it in items.iter_mut() {
            let staged = imports.next().flatten();
            let ch = &mut st.channels[it.channel];
            ch.busy = false;
            ch.link = std::mem::take(&mut it.link);
            ch.resume = Some(Resume {
                publish: it.publish,
                sent: it.sent,
                staged,
            });
        }
    }

    /// Step 5: installs the new peer mappings, releasing the ones they replace (a release never
    /// waits for device work; up to a bound of them are kept mapped for reuse instead, see
    /// `retain`). Returns the number of mappings released.
    fn commit(&self, items: &mut [Item], imports: Vec<Option<Imported>>) -> usize {
        let mut st = lock(&self.table);
        let mut hits = 0;
        let mut replaced = 0;
        // `imports` is empty when nothing was imported.
        let mut imports = imports.into_iter();
        for it in items.iter_mut() {
            let imp = imports.next().flatten();
            let fetched = imp.is_some();
            if let Some(imp) = imp {
                st.known.learn(it.ch.peer, it.ch.kind, &imp.record);
                let ch = &mut st.channels[it.channel];
                ch.peer_record = Some(imp.record);
                let old = ch.peer_side.replace(PeerSide {
                    mapping: imp.mapping,
                    bytes: imp.bytes,
                    semaphore: imp.semaphore,
                });
                ch.peer_opened = it.peer_version;
                if let Some(old) = old {
                    let limit = self.retained_per_peer();
                    for m in st.retained.retire(it.ch.kind, old.mapping, limit) {
                        self.release_mapping(it.ch.kind, &m);
                        replaced += 1;
                    }
                }
            }
            let ch = &mut st.channels[it.channel];
            if it.publish {
                ch.published = it.version;
            }
            ch.link = std::mem::take(&mut it.link);
            ch.busy = false;
            if !it.publish && !fetched {
                hits += 1;
            }
        }
        bump(&self.counters.hits, hits);
        let misses = items.len() as u64 - hits;
        if misses > 0 {
            bump(&self.counters.misses, misses);
        }
        replaced
    }

    /// Back-pressure on released mappings: the device transport closes them on a releaser thread
    /// once the device work queued before their release has finished; when more than its bound
    /// of one peer's mappings wait, this waits for the releaser, bounded by the call's timeout.
    /// A timeout fails the call without poisoning its channels: the new handles are installed
    /// and the replaced mappings stay queued.
    fn wait_release_room(
        &self,
        items: &[Item],
        replaced: usize,
        deadline: &mut Deadline,
    ) -> Result<()> {
        if replaced == 0 {
            return Ok(());
        }
        for (i, it) in items.iter().enumerate() {
            // One wait per (kind, peer) of the batch.
            if items[..i]
                .iter()
                .any(|o| o.ch.peer == it.ch.peer && o.ch.kind == it.ch.kind)
            {
                continue;
            }
            let Some(t) = self.transport(it.ch.kind) else {
                continue;
            };
            t.wait_release_room(it.ch.peer, deadline.remaining())
                .map_err(|e| {
                    e.context(format!(
                        "rank {}: {} (exchange timeout {:?}; its handles are current, the \
                         replaced mappings stay queued)",
                        self.cfg.rank,
                        it.ch.key,
                        deadline.timeout()
                    ))
                })?;
        }
        Ok(())
    }

    /// Maps the semaphore slabs of the peers whose buffers `imports` holds (those not mapped
    /// yet) and gives each import its peer semaphore's address here.
    pub(super) fn map_peer_slabs(
        &self,
        items: &[Item],
        imports: &mut [Option<Imported>],
        deadline: &mut Deadline,
    ) -> Result<()> {
        let mut st = lock(&self.table);
        for (it, imp) in items.iter().zip(imports.iter_mut()) {
            if let Some(imp) = imp {
                let base = self
                    .peer_slab(&mut st, it, &imp.sem_handle, deadline)
                    .map_err(|e| {
                        e.context(format!(
                            "rank {}: mapping peer rank {}'s semaphore slab for {}",
                            self.cfg.rank, it.ch.peer, it.ch.key
                        ))
                    })?;
                imp.semaphore = slot_address(base, imp.sem_slot);
            }
        }
        Ok(())
    }

    /// The base of `it.ch.peer`'s semaphore slab in this process, mapping it on first use.
    fn peer_slab(
        &self,
        st: &mut ChannelTable,
        it: &Item,
        handle: &ExportedHandle,
        deadline: &mut Deadline,
    ) -> Result<u64> {
        let key = (it.ch.peer, it.ch.kind);
        if let Some((h, base)) = st.peer_slabs.get(&key) {
            if h == handle {
                return Ok(*base);
            }
        }
        let slab = self
            .transport(it.ch.kind)
            .expect("channel kinds have transports")
            .semaphores();
        let base = slab.import_peer(it.ch.peer, handle, deadline.remaining())?;
        bump(&self.counters.opens, 1);
        // A peer that recreated its slab: drop our reference to the old one.
        if let Some((old, _)) = st.peer_slabs.insert(key, (handle.clone(), base)) {
            let _ = slab.release_peer(it.ch.peer, &old);
            bump(&self.counters.closes, 1);
        }
        Ok(base)
    }

    fn fail(&self, items: &[Item], err: &Error) {
        let mut st = lock(&self.table);
        for it in items {
            let ch = &mut st.channels[it.channel];
            ch.busy = false;
            ch.failed = Some(err.clone());
        }
    }

    /// The handles of the channel of `req` (as last exchanged): the request must match the
    /// pointer and size given to the last `exchange_handles` that included it.
    pub fn get(&self, req: &Request) -> Result<P2pHandles> {
        if req.peer >= self.cfg.world_size || req.peer == self.cfg.rank {
            return Err(Error::invalid(format!(
                "rank {}: get({req}): peer {} is not another rank of this world of {}",
                self.cfg.rank, req.peer, self.cfg.world_size
            )));
        }
        let st = lock(&self.table);
        let mut occ: u32 = 0;
        let mut any = false;
        while let Some(&i) = st.by_fp.get(&fingerprint_of(self.cfg.rank, req, occ)) {
            if !st.channels[i].info.key.is_of(self.cfg.rank, req, occ) {
                break;
            }
            any = true;
            let ch = &st.channels[i];
            let matches = ch
                .local
                .is_some_and(|l| l.ptr == req.ptr && l.bytes == req.bytes);
            if matches && ch.info.kind == req.kind {
                if let Some(err) = &ch.failed {
                    return Err(Error::state(format!(
                        "rank {}: {} failed in its last exchange: {}",
                        self.cfg.rank, ch.info.key, err.message
                    )));
                }
                let (Some(local), Some(peer)) = (&ch.local, &ch.peer_side) else {
                    break;
                };
                let t = self
                    .transport(ch.info.kind)
                    .expect("channel kinds have transports");
                return Ok(P2pHandles {
                    kind: ch.info.kind,
                    local_ptr: local.ptr,
                    local_bytes: local.bytes,
                    local_semaphore: t.semaphores().local(ch.info.slot)?,
                    peer_ptr: peer.mapping.ptr,
                    peer_bytes: peer.bytes,
                    peer_semaphore: peer.semaphore,
                    epochs: ch.epochs.clone(),
                    peer: ch.link.board.as_ref().map_or(
                        PeerProcess {
                            rank: ch.info.peer,
                            pid: 0,
                            checkable: false,
                        },
                        |b| b.owner(),
                    ),
                });
            }
            occ = occ.wrapping_add(1);
        }
        Err(Error::not_found(format!(
            "rank {}: no handles for {req}{}; call exchange_handles with this request first",
            self.cfg.rank,
            if any {
                " (the channel exists but was last exchanged for another buffer)"
            } else {
                ""
            }
        )))
    }

    pub(super) fn release_mapping(&self, kind: MemKind, m: &Mapping) {
        if let Some(t) = self.transport(kind) {
            // A failed release means the mapping is already gone; count it as closed anyway
            // so the balance reflects what this cache asked for.
            let _ = t.release(m);
            bump(&self.counters.closes, 1);
        }
    }

    pub(super) fn release_imports(&self, imports: Vec<Option<Imported>>) {
        for imp in imports.into_iter().flatten() {
            self.release_mapping(imp.kind, &imp.mapping);
        }
    }

    /// Removes what dead processes of this node left in `/dev/shm`: their boards. Called by
    /// every new cache (the next job) and every closing one (the survivors).
    pub(super) fn reclaim_dead_segments(&self) {
        super::board::reclaim_dead();
    }
}
