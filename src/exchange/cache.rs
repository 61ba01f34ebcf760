//! The handle cache and its exchange protocol.
//!
//! Per channel (see [`channel`](super::channel)) every rank keeps a buffer *version* (bumped when
//! the resolved identity of its buffer changes) and a *step* (how many `exchange_handles` calls
//! included the channel). One call:
//!
//! 1. resolves every request to its allocation and bumps step (and version, on change);
//! 2. when its version changed since it last published, sends its new records with one
//!    `multi_set` (fire-and-forget; the key contains the version, so it can never overwrite an
//!    unread one), then publishes `(step, version)` on its node-local [board](super::board);
//! 3. waits, on the peers' boards, until each peer has reached the same step and reads the peer's
//!    version for that step: both ranks now agree on what changed, without a barrier;
//! 4. fetches, with one `multi_get`, the records of every peer whose version differs from the one
//!    it has opened, imports them, publishes the versions it opened on the board, and waits until
//!    the peer has opened every buffer this rank published (so when the call returns both sides
//!    hold each other's current buffers; then the replaced mappings are released: a release
//!    never waits for device work, the device transport closes them on its releaser thread once
//!    the work queued before the release has finished, and when more than its bound of one peer's
//!    mappings wait the call waits for the releaser, bounded by its timeout);
//! 5. hands the keys it has read to a background thread that deletes them from the store.
//!
//! A hit on both sides costs a few shared-memory loads and no store operation, and neither
//! allocates nor makes a syscall (per-call buffers are reused per thread; channels are found by
//! their board fingerprint; the clock is read only when a peer is not there yet). A miss costs at
//! most one `multi_set` and one `multi_get`. A call that times out because a peer is not there
//! yet (it has not reached the same step, or has not opened this rank's new buffer) leaves its
//! channels suspended in that step, so a zero timeout checks once: calling again with the same
//! batch (same buffers) resumes the step where it stopped, and the peer never notices. Any other
//! failure (a peer that closed or died, a bad record, a store error) poisons the channels of its
//! batch: later calls on them fail with `InvalidState` (create a new cache).
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
//!
//! Thread safety: every method takes `&self`. Calls on *different* channels may run concurrently
//! from several threads (the state lock is never held across a board wait or a store call); a call
//! that includes a channel already being exchanged by another thread fails with `InvalidState`.
//! `get` and `stats` may run at any time.

use super::board::{OwnBoard, PeerBoard};
use super::channel::{fingerprint_of, occurrence, ChannelKey, Request};
use super::collector::Collector;
use super::peers::PeerNodes;
use super::retain::{Retained, DEFAULT_RETAINED_PER_PEER};
use super::stats::{bump, CacheStats, Counters};
use crate::context::Context;
use crate::error::{Error, Result, Status};
use crate::node::PeerProcess;
use crate::os::wait::wait_until;
use crate::store::Store;
use crate::sync::lock;
use crate::transport::epoch::TransferEpochs;
use crate::transport::record::{self, flags, local_host, Record};
use crate::transport::{
    slot_address, ExportedHandle, LocalBuffer, Mapping, MemKind, P2pHandles, Transport, Transports,
};
use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
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
    /// Bound of every wait of an exchange (board and store).
    pub timeout: Duration,
}

impl CacheConfig {
    /// The configuration of `ctx` (its rank, world, store, job id and timeout), scope "".
    pub fn from_context(ctx: &Context) -> CacheConfig {
        CacheConfig {
            rank: ctx.rank(),
            world_size: ctx.world_size(),
            store: ctx.store().clone(),
            job_id: ctx.job_id().to_string(),
            scope: String::new(),
            timeout: ctx.timeout(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct Identity {
    base: u64,
    buffer_id: u64,
    offset: u64,
    bytes: u64,
}

struct PeerSide {
    mapping: Mapping,
    bytes: u64,
    semaphore: u64,
}

struct Channel {
    key: Arc<ChannelKey>,
    peer: usize,
    kind: MemKind,
    slot: u32,
    entry: u32,
    fp: u128,
    step: u64,
    version: u64,
    identity: Option<Identity>,
    local: Option<LocalBuffer>,
    published: u64,
    peer_opened: u64,
    peer_side: Option<PeerSide>,
    /// The peer's board and this channel's entry in it, once found.
    peer_board: Option<Arc<PeerBoard>>,
    peer_entry: Option<u32>,
    busy: bool,
    failed: Option<Error>,
    /// Set when a call timed out waiting for the peer: the step it left unfinished.
    resume: Option<Resume>,
    epochs: Arc<TransferEpochs>,
}

/// What a call that timed out waiting for a peer leaves for the next call on its channel: the
/// step and version stay; records already sent are not sent again; a peer buffer already opened
/// is kept.
struct Resume {
    publish: bool,
    sent: bool,
    staged: Option<Imported>,
}

/// Hashes a channel fingerprint, already uniformly distributed, by folding it (no SipHash on
/// the exchange path).
#[derive(Default)]
struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = (n as u64) ^ ((n >> 64) as u64);
    }
}

type ByFingerprint = HashMap<u128, usize, BuildHasherDefault<FingerprintHasher>>;

#[derive(Default)]
struct State {
    channels: Vec<Channel>,
    /// Channel index by fingerprint (the channel's key is compared too).
    by_fp: ByFingerprint,
    /// Peer semaphore slabs mapped by this cache, per (peer, kind).
    peer_slabs: HashMap<(usize, MemKind), (ExportedHandle, u64)>,
    /// Replaced peer mappings kept mapped for reuse (see `retain`).
    retained: Retained,
}

/// Work of one request in one call, captured under the lock.
struct Item {
    channel: usize,
    key: Arc<ChannelKey>,
    peer: usize,
    kind: MemKind,
    slot: u32,
    entry: u32,
    fp: u128,
    step: u64,
    version: u64,
    local: LocalBuffer,
    publish: bool,
    peer_opened: u64,
    peer_board: Option<Arc<PeerBoard>>,
    peer_entry: Option<u32>,
    peer_version: u64,
    /// Still waited for by the current wait (peer's step, then peer's open).
    waiting: bool,
    /// Resuming a suspended step: its records are already in the store.
    sent: bool,
    /// Resuming a suspended step: the peer's buffer, already opened then.
    staged: Option<Imported>,
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

/// The deadline of a call's waits. It starts at the first wait that needs it, so a call whose
/// peers are already there never reads the clock.
struct Deadline {
    timeout: Duration,
    at: Option<Instant>,
}

impl Deadline {
    fn new(timeout: Duration) -> Deadline {
        Deadline { timeout, at: None }
    }

    fn remaining(&mut self) -> Duration {
        let timeout = self.timeout;
        let at = *self.at.get_or_insert_with(|| Instant::now() + timeout);
        at.saturating_duration_since(Instant::now())
    }
}

/// Polls of a board wait before the first liveness check of the peers (`kill(pid, 0)`, a
/// syscall): past the spin phase of `wait_until`, so a peer a few microseconds late costs none.
const FIRST_LIVENESS_POLL: u32 = 2048;
/// Polls between two liveness checks after that (about 100 ms once sleeping).
const LIVENESS_EVERY: u32 = 256;

fn liveness_check_due(polls: u32) -> bool {
    polls >= FIRST_LIVENESS_POLL && polls % LIVENESS_EVERY == 0
}

/// What a peer was awaited for when it closed or exited (for messages).
#[derive(Clone, Copy)]
enum Stage {
    Step,
    Open,
}

/// Upper bound of the default [linger](HandleCache::linger): min(timeout, this).
pub const DEFAULT_MAX_LINGER: Duration = Duration::from_secs(30);
/// `linger_ns` value meaning "derived from the timeout".
const LINGER_FROM_TIMEOUT: u64 = u64::MAX;

/// Teardowns in this process that stopped waiting for peers to close (and so kept device memory
/// alive on purpose). Drop cannot report anything else.
static TEARDOWNS_TIMED_OUT: AtomicU64 = AtomicU64::new(0);

/// How many cache teardowns in this process gave up waiting for peers to close (each left its
/// device semaphore slab allocated rather than free it under a peer's mapping).
pub fn teardowns_timed_out() -> u64 {
    TEARDOWNS_TIMED_OUT.load(Ordering::Relaxed)
}

/// Exchanges and caches P2P handles between the ranks of one job.
pub struct HandleCache {
    cfg: CacheConfig,
    /// Handed in by the layer that builds the cache (see `Transports`).
    transports: Transports,
    board: OwnBoard,
    peer_boards: Mutex<HashMap<usize, Arc<PeerBoard>>>,
    peer_nodes: PeerNodes,
    state: Mutex<State>,
    counters: Counters,
    collector: Mutex<Collector>,
    timeout_ns: AtomicU64,
    /// Bound of the teardown's wait for peers; `LINGER_FROM_TIMEOUT` until set.
    linger_ns: AtomicU64,
    /// Set by the first teardown (close, then drop, run it twice).
    torn_down: bool,
    /// Bound of the replaced peer allocations kept mapped per (peer, kind) (see `retain`).
    retain_per_peer: AtomicUsize,
}

/// Removes what dead processes of this node left in `/dev/shm`: their boards, and what the
/// transports reclaim (host buffers and slabs). Called by every new cache (the next job) and
/// every closing one (the survivors).
fn reclaim_dead_segments(transports: &Transports) {
    super::board::reclaim_dead();
    for t in transports.existing() {
        t.reclaim_dead();
    }
}

pub use crate::names::board_name;

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
        reclaim_dead_segments(&transports);
        let board = OwnBoard::create(&board_name(&cfg.job_id, &cfg.scope, cfg.rank), cfg.rank)
            .map_err(|e| e.context(format!("rank {}", cfg.rank)))?;
        let peer_nodes = PeerNodes::publish(&*cfg.store, &cfg.job_id, &cfg.scope, cfg.rank)?;
        let counters = Counters::default();
        let collector = Collector::start(cfg.store.clone(), counters.keys_deleted.clone())?;
        let timeout_ns = AtomicU64::new(cfg.timeout.as_nanos().min(u64::MAX as u128) as u64);
        Ok(HandleCache {
            cfg,
            transports,
            board,
            peer_boards: Mutex::new(HashMap::new()),
            peer_nodes,
            state: Mutex::new(State::default()),
            counters,
            collector: Mutex::new(collector),
            timeout_ns,
            linger_ns: AtomicU64::new(LINGER_FROM_TIMEOUT),
            torn_down: false,
            retain_per_peer: AtomicUsize::new(DEFAULT_RETAINED_PER_PEER),
        })
    }

    /// Adds (or replaces before first use) the transport of its memory kind, e.g. the device one.
    pub fn with_transport(mut self, t: Arc<dyn Transport>) -> Result<HandleCache> {
        if !lock(&self.state).channels.is_empty() {
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

    /// The transport of `kind`, if this cache has one.
    pub fn transport(&self, kind: MemKind) -> Option<&Arc<dyn Transport>> {
        self.transports.get(kind)
    }

    /// The bound of every wait of [`exchange_handles`](Self::exchange_handles).
    pub fn timeout(&self) -> Duration {
        Duration::from_nanos(self.timeout_ns.load(Ordering::Relaxed))
    }

    pub fn set_timeout(&self, timeout: Duration) {
        let ns = timeout.as_nanos().min(u64::MAX as u128) as u64;
        self.timeout_ns.store(ns, Ordering::Relaxed);
    }

    /// The bound of the teardown's wait for peers to close: the value given to
    /// [`set_linger`](Self::set_linger), else min([`timeout`](Self::timeout),
    /// [`DEFAULT_MAX_LINGER`]).
    pub fn linger(&self) -> Duration {
        match self.linger_ns.load(Ordering::Relaxed) {
            LINGER_FROM_TIMEOUT => self.timeout().min(DEFAULT_MAX_LINGER),
            ns => Duration::from_nanos(ns),
        }
    }

    /// Sets the bound of the teardown's wait for peers to close (zero: check once).
    pub fn set_linger(&self, linger: Duration) {
        let ns = linger.as_nanos().min(u128::from(LINGER_FROM_TIMEOUT - 1)) as u64;
        self.linger_ns.store(ns, Ordering::Relaxed);
    }

    /// How many replaced peer allocations the cache keeps mapped per (peer, memory kind), so that
    /// buffers carved again from them cost no open (default [`DEFAULT_RETAINED_PER_PEER`]).
    pub fn retained_per_peer(&self) -> usize {
        self.retain_per_peer.load(Ordering::Relaxed)
    }

    /// Sets [`retained_per_peer`](Self::retained_per_peer); 0 releases every replaced mapping at
    /// once. Takes effect at the next replacement.
    pub fn set_retained_per_peer(&self, per_peer: usize) {
        self.retain_per_peer.store(per_peer, Ordering::Relaxed);
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
        let result = self.run(items, timeout, &mut deadline);
        match result {
            Ok(imports) => {
                let replaced = self.commit(items, imports, &mut deadline)?;
                bump(&self.counters.exchanges, 1);
                self.wait_release_room(items, replaced, timeout, &mut deadline)
            }
            Err(RunError::NotReady(err, imports)) => {
                self.suspend(items, imports);
                Err(err)
            }
            Err(RunError::Fatal(err)) => {
                self.fail(items, &err);
                Err(err)
            }
        }
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
        let mut st = lock(&self.state);
        // Pass 1: find or create every channel and check it can be used; no step moves yet.
        for (n, r) in requests.iter().enumerate() {
            let occ = occurrence(requests, n);
            let fp = fingerprint_of(rank, r, occ);
            let idx = match st.by_fp.get(&fp) {
                Some(&i) => {
                    let key = &st.channels[i].key;
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
                    self.cfg.rank, ch.key, err.message
                )));
            }
            if ch.busy {
                return Err(Error::state(format!(
                    "rank {}: {} is being exchanged by another thread; calls on the same \
                     channel must not overlap",
                    self.cfg.rank, ch.key
                )));
            }
            if ch.kind != r.kind {
                return Err(Error::invalid(format!(
                    "rank {}: {} was used with {} memory and now with {}: a channel keeps its \
                     memory kind (use another tag)",
                    self.cfg.rank,
                    ch.key,
                    ch.kind.name(),
                    r.kind.name()
                )));
            }
            indices.push(idx);
        }
        // A suspended step resumes with the buffer it started with.
        for (&idx, local) in indices.iter().zip(resolved) {
            let ch = &st.channels[idx];
            if ch.resume.is_some() && ch.identity != Some(identity_of(local)) {
                return Err(Error::invalid(format!(
                    "rank {}: {} timed out waiting for its peer at step {} and must be resumed \
                     with the same buffer; call again with the buffer of that call",
                    self.cfg.rank, ch.key, ch.step
                )));
            }
        }
        // Pass 2: advance (or resume).
        for (&idx, &local) in indices.iter().zip(resolved) {
            let ch = &mut st.channels[idx];
            let resume = ch.resume.take();
            if resume.is_none() {
                let identity = identity_of(&local);
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
                key: ch.key.clone(),
                peer: ch.peer,
                kind: ch.kind,
                slot: ch.slot,
                entry: ch.entry,
                fp: ch.fp,
                step: ch.step,
                version: ch.version,
                local,
                publish,
                peer_opened: ch.peer_opened,
                // Moved, not cloned: the channel is this call's until commit puts it back.
                peer_board: ch.peer_board.take(),
                peer_entry: ch.peer_entry,
                peer_version: 0,
                waiting: false,
                sent,
                staged,
            });
        }
        Ok(())
    }

    fn create_channel(
        &self,
        st: &mut State,
        r: &Request,
        key: ChannelKey,
        fp: u128,
    ) -> Result<usize> {
        let t = self.transport(r.kind).expect("checked by resolve");
        let entry = self.board.insert(fp)?;
        let slot = t.semaphores().allocate_slot()?;
        st.channels.push(Channel {
            key: Arc::new(key),
            peer: r.peer,
            kind: r.kind,
            slot,
            entry,
            fp,
            step: 0,
            version: 0,
            identity: None,
            local: None,
            published: 0,
            peer_opened: 0,
            peer_side: None,
            peer_board: None,
            peer_entry: None,
            busy: false,
            failed: None,
            resume: None,
            epochs: Arc::new(TransferEpochs::default()),
        });
        Ok(st.channels.len() - 1)
    }

    /// Steps 2-4, without the state lock. Returns the new peer mappings by item index.
    fn run(
        &self,
        items: &mut [Item],
        timeout: Duration,
        deadline: &mut Deadline,
    ) -> std::result::Result<Vec<Option<Imported>>, RunError> {
        // A channel that has not found its peer's board yet may have a peer that can never
        // have one here (another host or container): refuse it before anything is published.
        // A board found on this node's /dev/shm settles it (an IPC namespace it does not share
        // is still refused when its records are imported); so the lookup, one store round trip,
        // happens only for a peer whose board is not there yet.
        let mut unknown: Vec<usize> = Vec::new();
        for it in items.iter_mut().filter(|it| it.peer_board.is_none()) {
            if self.peer_nodes.known(it.peer) {
                continue;
            }
            match self.peer_board(it.peer) {
                Ok(Some(board)) => it.peer_board = Some(board),
                _ => unknown.push(it.peer),
            }
        }
        if !unknown.is_empty() {
            bump(&self.counters.peer_lookups, 1);
            self.peer_nodes
                .check(&*self.cfg.store, &unknown, deadline.remaining())
                .map_err(|e| RunError::classify(e, Vec::new()))?;
        }
        // Records go out before the step is visible on the board: a peer that sees the step
        // knows the records are already on their way to the store, so its multi_get never waits
        // on this rank's progress (which matters when several threads share one store client).
        self.send_records(items).map_err(RunError::Fatal)?;
        for it in items.iter_mut() {
            it.sent = true;
        }
        for it in items.iter() {
            self.board.publish(it.entry, it.step, it.version);
        }
        if let Err(e) = self.wait_peers(items, timeout, deadline) {
            let staged = items.iter_mut().map(|it| it.staged.take()).collect();
            return Err(RunError::classify(e, staged));
        }
        let imports = match self.fetch_records(items, timeout, deadline) {
            Ok(imports) => imports,
            Err(e) if e.status == Status::Timeout => {
                // Records are sent without waiting for the store's reply, so a peer's step can be
                // visible before its records are: a zero timeout may miss them. Retryable.
                let staged = items.iter_mut().map(|it| it.staged.take()).collect();
                return Err(RunError::NotReady(e, staged));
            }
            Err(e) => {
                for it in items.iter_mut() {
                    if let Some(imp) = it.staged.take() {
                        self.release_mapping(imp.kind, &imp.mapping);
                    }
                }
                return Err(RunError::Fatal(e));
            }
        };
        for (it, imp) in items.iter().zip(&imports) {
            if imp.is_some() {
                self.board.publish_opened(it.entry, it.peer_version);
            }
        }
        if let Err(e) = self.wait_opened(items, timeout, deadline) {
            if e.status == Status::Timeout {
                return Err(RunError::NotReady(e, imports));
            }
            self.release_imports(imports);
            return Err(RunError::Fatal(e));
        }
        Ok(imports)
    }

    /// A call that timed out waiting for a peer: its channels keep their step, version and
    /// what was opened, for the next call with the same batch to resume.
    fn suspend(&self, items: &mut [Item], imports: Vec<Option<Imported>>) {
        let mut st = lock(&self.state);
        let mut imports = imports.into_iter();
        for it in items.iter_mut() {
            let staged = imports.next().flatten();
            let ch = &mut st.channels[it.channel];
            ch.busy = false;
            ch.peer_board = it.peer_board.take();
            ch.peer_entry = it.peer_entry;
            ch.resume = Some(Resume {
                publish: it.publish,
                sent: it.sent,
                staged,
            });
        }
    }

    /// Step 4b: for every channel where this rank published a new buffer, waits until the peer
    /// has opened it. So when a call returns, both sides hold handles to each other's current
    /// buffers, and the exporter may free an old buffer without racing the peer's open.
    fn wait_opened(
        &self,
        items: &mut [Item],
        timeout: Duration,
        deadline: &mut Deadline,
    ) -> Result<()> {
        let mut left = 0;
        for it in items.iter_mut() {
            it.waiting = it.publish;
            left += usize::from(it.publish);
        }
        if left == 0 {
            return Ok(());
        }
        let mut error: Option<Error> = None;
        let mut polls: u32 = 0;
        let remaining = deadline.remaining();
        let done = wait_until(remaining, || {
            polls = polls.wrapping_add(1);
            // Checked before the entries: what a peer published before it closed or exited is
            // visible once its `closed` flag or its death is, and then it is no failure.
            let gone = if liveness_check_due(polls) {
                self.gone_peer(items, Stage::Open)
            } else {
                None
            };
            for it in items.iter_mut().filter(|it| it.waiting) {
                let still = match (&it.peer_board, it.peer_entry) {
                    (Some(b), Some(e)) => b.opened(e) < it.version,
                    _ => true,
                };
                if !still {
                    it.waiting = false;
                    left -= 1;
                }
            }
            error = gone.and_then(|(i, e)| items[i].waiting.then_some(e));
            (left == 0 || error.is_some()).then_some(())
        });
        if let Some(e) = error {
            return Err(e);
        }
        if done.is_some() {
            return Ok(());
        }
        // A wait that timed out left an item pending; none left means it completed.
        let Some(it) = items.iter().find(|it| it.waiting) else {
            return Ok(());
        };
        let opened = match (&it.peer_board, it.peer_entry) {
            (Some(b), Some(e)) => b.opened(e),
            _ => 0,
        };
        Err(Error::timeout(format!(
            "rank {} timed out after {:?} waiting for peer rank {} to open version {} of this \
             rank's buffer on {} at step {} (board entry {} of {} shows version {opened} \
             opened; key {:?}); did the peer fail in exchange_handles?",
            self.cfg.rank,
            timeout,
            it.peer,
            it.version,
            it.key,
            it.step,
            it.key.describe(),
            board_name(&self.cfg.job_id, &self.cfg.scope, it.peer),
            it.key
                .record_key(&self.cfg.job_id, &self.cfg.scope, self.cfg.rank, it.version),
        )))
    }

    fn send_records(&self, items: &[Item]) -> Result<()> {
        let mut pairs: Vec<(String, Vec<u8>)> = Vec::new();
        for it in items.iter().filter(|it| it.publish && !it.sent) {
            let rec = self.make_record(it).map_err(|e| {
                e.context(format!(
                    "rank {}: exporting the buffer of {}",
                    self.cfg.rank, it.key
                ))
            })?;
            let key =
                it.key
                    .record_key(&self.cfg.job_id, &self.cfg.scope, self.cfg.rank, it.version);
            pairs.push((key, rec.encode()));
        }
        if pairs.is_empty() {
            return Ok(());
        }
        let refs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        bump(&self.counters.store_round_trips, 1);
        self.cfg.store.multi_set(&refs).map_err(|e| {
            e.context(format!(
                "rank {}: publishing {} record(s) (first key {})",
                self.cfg.rank,
                pairs.len(),
                pairs[0].0
            ))
        })?;
        bump(&self.counters.records_sent, pairs.len() as u64);
        let bytes: usize = pairs.iter().map(|(_, v)| v.len()).sum();
        bump(&self.counters.record_bytes_sent, bytes as u64);
        Ok(())
    }

    fn make_record(&self, it: &Item) -> Result<Record> {
        let t = self
            .transport(it.kind)
            .expect("channel kinds have transports");
        let handle = t.export(&it.local)?;
        let slab = t.semaphores().export()?;
        let host = local_host();
        Ok(Record {
            handle_type: handle.handle_type,
            flags: if it.kind == MemKind::Device {
                flags::DEVICE
            } else {
                0
            },
            offset: it.local.offset(),
            bytes: it.local.bytes,
            alloc_bytes: it.local.alloc_bytes,
            buffer_id: it.local.buffer_id,
            host_id: host.id,
            version: it.version,
            device_uuid: it.local.device_uuid,
            pid: std::process::id(),
            rank: self.cfg.rank as u32,
            host_name: record::to_fixed(&host.name).unwrap_or([0; record::HOST_NAME_LEN]),
            payload: handle.payload,
            sem_type: slab.handle_type,
            sem_slot: it.slot,
            sem_payload: slab.payload,
        })
    }

    fn peer_board(&self, peer: usize) -> Result<Option<Arc<PeerBoard>>> {
        if let Some(b) = lock(&self.peer_boards).get(&peer) {
            return Ok(Some(b.clone()));
        }
        let name = board_name(&self.cfg.job_id, &self.cfg.scope, peer);
        let Some(board) = PeerBoard::try_open(&name, peer)? else {
            return Ok(None);
        };
        let board = Arc::new(board);
        lock(&self.peer_boards).insert(peer, board.clone());
        Ok(Some(board))
    }

    /// Step 3: waits until every peer has reached this call's step on its channel.
    fn wait_peers(
        &self,
        items: &mut [Item],
        timeout: Duration,
        deadline: &mut Deadline,
    ) -> Result<()> {
        for it in items.iter_mut() {
            it.waiting = true;
        }
        let mut left = items.len();
        let mut error: Option<Error> = None;
        let mut polls: u32 = 0;
        let mut poll = || {
            polls = polls.wrapping_add(1);
            // Now and then (about every 100 ms once sleeping), make sure the peers still exist
            // and have not closed their caches, so a crashed or closed peer is reported at once
            // rather than at the timeout. Checked before the entries (see `wait_opened`).
            let gone = if liveness_check_due(polls) {
                self.gone_peer(items, Stage::Step)
            } else {
                None
            };
            for it in items.iter_mut().filter(|it| it.waiting) {
                if error.is_some() {
                    break;
                }
                if it.peer_board.is_none() {
                    match self.peer_board(it.peer) {
                        Ok(b) => it.peer_board = b,
                        Err(e) => {
                            error = Some(e.context(format!("rank {}", self.cfg.rank)));
                            break;
                        }
                    }
                }
                let Some(board) = &it.peer_board else {
                    continue;
                };
                if it.peer_entry.is_none() {
                    it.peer_entry = board.find(it.fp);
                }
                let Some(entry) = it.peer_entry else {
                    continue;
                };
                if let Some(v) = board.read(entry, it.step) {
                    it.peer_version = v;
                    it.waiting = false;
                    left -= 1;
                }
            }
            if error.is_none() {
                error = gone.and_then(|(i, e)| items[i].waiting.then_some(e));
            }
            (left == 0 || error.is_some()).then_some(())
        };
        // Peers usually are there already: then the clock is never read.
        let done = match poll() {
            Some(()) => Some(()),
            None => wait_until(deadline.remaining(), &mut poll),
        };
        if let Some(e) = error {
            return Err(e);
        }
        if done.is_some() {
            return Ok(());
        }
        let pending = items.iter().filter(|it| it.waiting).count();
        // A wait that timed out left an item pending; none left means it completed.
        let Some(it) = items.iter().find(|it| it.waiting) else {
            return Ok(());
        };
        let name = board_name(&self.cfg.job_id, &self.cfg.scope, it.peer);
        let seen = match (self.peer_board(it.peer), it.peer_entry) {
            (Ok(Some(b)), Some(e)) => format!("its entry is at step {}", b.step(e)),
            (Ok(Some(_)), None) => "it has not used this channel yet".to_string(),
            _ => "its board does not exist yet (has it created its cache?)".to_string(),
        };
        Err(Error::timeout(format!(
            "rank {} timed out after {:?} waiting for peer rank {} on {} at step {}: board \
             entry {} of {} not at step {} ({seen}); {} other channel(s) also pending. Does \
             rank {} call exchange_handles with the matching request?",
            self.cfg.rank,
            timeout,
            it.peer,
            it.key,
            it.step,
            it.key.describe(),
            name,
            it.step,
            pending - 1,
            it.peer,
        )))
    }

    /// The first pending item whose peer has closed its cache or exited, with an error naming
    /// the peer and what this rank was waiting for.
    fn gone_peer(&self, items: &[Item], stage: Stage) -> Option<(usize, Error)> {
        items.iter().enumerate().find_map(|(i, it)| {
            if !it.waiting {
                return None;
            }
            let board = it.peer_board.as_ref()?;
            let closed = board.closed();
            if !closed && board.owner_alive() {
                return None;
            }
            let waited_for = match stage {
                Stage::Step => format!("reaching step {} on {}", it.step, it.key),
                Stage::Open => format!(
                    "opening version {} of this rank's buffer on {} at step {}",
                    it.version, it.key, it.step
                ),
            };
            let (who, pid) = (it.peer, board.owner_pid());
            let err = if closed {
                Error::state(format!(
                    "rank {}: peer rank {who} (pid {pid}) closed its cache before {waited_for}; \
                     a closed cache takes no part in exchanges (create new caches on both ranks)",
                    self.cfg.rank
                ))
            } else {
                Error::io(format!(
                    "rank {}: peer rank {who} (pid {pid}) exited before {waited_for}",
                    self.cfg.rank
                ))
            };
            Some((i, err))
        })
    }

    /// Refuses to import a record of a peer that has closed its cache: it may free that memory
    /// as soon as the ranks it waits for have closed.
    fn refuse_closed_peer(&self, it: &Item, key: &str) -> Result<()> {
        match &it.peer_board {
            Some(b) if b.closed() => Err(Error::state(format!(
                "rank {}: peer rank {} (pid {}) closed its cache before this rank opened its \
                 record {key:?} for {}; a closed cache takes no part in exchanges (create new \
                 caches on both ranks)",
                self.cfg.rank,
                it.peer,
                b.owner_pid(),
                it.key
            ))),
            _ => Ok(()),
        }
    }

    /// Step 4: fetches and imports the records of peers whose version changed.
    /// Returns the imports by item index; empty (nothing imported) when every peer is cached.
    fn fetch_records(
        &self,
        items: &mut [Item],
        timeout: Duration,
        deadline: &mut Deadline,
    ) -> Result<Vec<Option<Imported>>> {
        if items
            .iter()
            .all(|it| it.peer_version == it.peer_opened && it.staged.is_none())
        {
            return Ok(Vec::new());
        }
        let mut imports: Vec<Option<Imported>> = items.iter().map(|_| None).collect();
        // A resumed step already opened these (the peer's version at a step never changes).
        for (it, imp) in items.iter_mut().zip(imports.iter_mut()) {
            if it.staged.is_some() {
                *imp = it.staged.take();
            }
        }
        let wanted: Vec<usize> = (0..items.len())
            .filter(|&i| items[i].peer_version != items[i].peer_opened && imports[i].is_none())
            .collect();
        if wanted.is_empty() {
            return Ok(imports);
        }
        let keys: Vec<String> = wanted
            .iter()
            .map(|&i| {
                let it = &items[i];
                it.key
                    .record_key(&self.cfg.job_id, &self.cfg.scope, it.peer, it.peer_version)
            })
            .collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        bump(&self.counters.store_round_trips, 1);
        let remaining = deadline.remaining();
        let fetched = self.cfg.store.multi_get(&key_refs, remaining);
        if fetched.is_err() {
            // What a resumed step had opened goes back to its item: a timeout suspends the step
            // with it, any other failure releases it.
            for (it, imp) in items.iter_mut().zip(imports.iter_mut()) {
                if imp.is_some() {
                    it.staged = imp.take();
                }
            }
        }
        let values = fetched.map_err(|e| {
            let it = &items[wanted[0]];
            Error::new(
                e.status,
                format!(
                    "rank {}: fetching {} record(s) from the store failed after at most {:?}: \
                     first: peer rank {}'s record for {} at step {}, version {}, key {:?}: {}",
                    self.cfg.rank,
                    keys.len(),
                    timeout,
                    it.peer,
                    it.key,
                    it.step,
                    it.peer_version,
                    keys[0],
                    e.message
                ),
            )
        })?;
        if values.len() != keys.len() {
            return Err(Error::protocol(format!(
                "rank {}: the store returned {} values for {} keys",
                self.cfg.rank,
                values.len(),
                keys.len()
            )));
        }
        self.collector_delete(keys.clone());
        let wait = deadline.remaining();
        for ((&i, value), key) in wanted.iter().zip(&values).zip(&keys) {
            let imported = self
                .refuse_closed_peer(&items[i], key)
                .and_then(|()| self.import(&items[i], value, key, wait));
            match imported {
                Ok(imp) => imports[i] = Some(imp),
                Err(e) => {
                    self.release_imports(imports);
                    return Err(e);
                }
            }
        }
        bump(&self.counters.records_received, wanted.len() as u64);
        Ok(imports)
    }

    fn collector_delete(&self, keys: Vec<String>) {
        lock(&self.collector).delete(keys);
    }

    fn import(&self, it: &Item, value: &[u8], key: &str, wait: Duration) -> Result<Imported> {
        let ctx = || {
            format!(
                "rank {}: record {key:?} of peer rank {} for {}",
                self.cfg.rank, it.peer, it.key
            )
        };
        let rec = Record::decode(value).map_err(|e| e.context(ctx()))?;
        if rec.rank as usize != it.peer || rec.version != it.peer_version {
            return Err(Error::protocol(format!(
                "{}: holds rank {} version {}, expected rank {} version {}",
                ctx(),
                rec.rank,
                rec.version,
                it.peer,
                it.peer_version
            )));
        }
        let is_device = rec.flags & flags::DEVICE != 0;
        if is_device != (it.kind == MemKind::Device) {
            return Err(Error::invalid(format!(
                "{}: the peer's buffer is {} memory but this rank's is {}: both sides of a \
                 channel must use the same memory kind",
                ctx(),
                if is_device { "device" } else { "host" },
                it.kind.name()
            )));
        }
        let t = self
            .transport(it.kind)
            .expect("channel kinds have transports");
        let mapping = t.import(&rec, wait).map_err(|e| e.context(ctx()))?;
        bump(&self.counters.opens, 1);
        Ok(Imported {
            kind: it.kind,
            mapping,
            bytes: rec.bytes,
            sem_handle: ExportedHandle {
                handle_type: rec.sem_type,
                payload: rec.sem_payload,
            },
            sem_slot: rec.sem_slot,
        })
    }

    fn release_mapping(&self, kind: MemKind, m: &Mapping) {
        if let Some(t) = self.transport(kind) {
            // A failed release means the mapping is already gone; count it as closed anyway
            // so the balance reflects what this cache asked for.
            let _ = t.release(m);
            bump(&self.counters.closes, 1);
        }
    }

    fn release_imports(&self, imports: Vec<Option<Imported>>) {
        for imp in imports.into_iter().flatten() {
            self.release_mapping(imp.kind, &imp.mapping);
        }
    }

    /// Step 5: installs the new peer mappings, releasing the ones they replace (a release never
    /// waits for device work; up to a bound of them are kept mapped for reuse instead, see
    /// `retain`). Returns the number of mappings released.
    fn commit(
        &self,
        items: &mut [Item],
        imports: Vec<Option<Imported>>,
        deadline: &mut Deadline,
    ) -> Result<usize> {
        let mut st = lock(&self.state);
        let mut hits = 0;
        let mut replaced = 0;
        let mut slab_errors: Vec<(usize, Error)> = Vec::new();
        // `imports` is empty when nothing was imported.
        let mut imports = imports.into_iter();
        for it in items.iter_mut() {
            let imp = imports.next().flatten();
            let fetched = imp.is_some();
            if let Some(imp) = imp {
                let sem_base = match self.peer_slab(&mut st, it, &imp.sem_handle, deadline) {
                    Ok(base) => base,
                    Err(e) => {
                        self.release_mapping(it.kind, &imp.mapping);
                        slab_errors.push((it.channel, e));
                        continue;
                    }
                };
                let ch = &mut st.channels[it.channel];
                let old = ch.peer_side.replace(PeerSide {
                    mapping: imp.mapping,
                    bytes: imp.bytes,
                    semaphore: slot_address(sem_base, imp.sem_slot),
                });
                ch.peer_opened = it.peer_version;
                if let Some(old) = old {
                    let limit = self.retained_per_peer();
                    for m in st.retained.retire(it.kind, old.mapping, limit) {
                        self.release_mapping(it.kind, &m);
                        replaced += 1;
                    }
                }
            }
            let ch = &mut st.channels[it.channel];
            if it.publish {
                ch.published = it.version;
            }
            ch.peer_board = it.peer_board.take();
            ch.peer_entry = it.peer_entry;
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
        let first = slab_errors.first().map(|(_, e)| e.clone());
        for (channel, e) in slab_errors {
            st.channels[channel].failed = Some(e);
        }
        match first {
            Some(e) => Err(e.context(format!(
                "rank {}: mapping a peer's semaphore slab",
                self.cfg.rank
            ))),
            None => Ok(replaced),
        }
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
        timeout: Duration,
        deadline: &mut Deadline,
    ) -> Result<()> {
        if replaced == 0 {
            return Ok(());
        }
        for (i, it) in items.iter().enumerate() {
            // One wait per (kind, peer) of the batch.
            if items[..i]
                .iter()
                .any(|o| o.peer == it.peer && o.kind == it.kind)
            {
                continue;
            }
            let Some(t) = self.transport(it.kind) else {
                continue;
            };
            t.wait_release_room(it.peer, deadline.remaining())
                .map_err(|e| {
                    e.context(format!(
                        "rank {}: {} (exchange timeout {timeout:?}; its handles are current, the \
                         replaced mappings stay queued)",
                        self.cfg.rank, it.key
                    ))
                })?;
        }
        Ok(())
    }

    /// The base of `it.peer`'s semaphore slab in this process, mapping it on first use.
    fn peer_slab(
        &self,
        st: &mut State,
        it: &Item,
        handle: &ExportedHandle,
        deadline: &mut Deadline,
    ) -> Result<u64> {
        let key = (it.peer, it.kind);
        if let Some((h, base)) = st.peer_slabs.get(&key) {
            if h == handle {
                return Ok(*base);
            }
        }
        let slab = self
            .transport(it.kind)
            .expect("channel kinds have transports")
            .semaphores();
        let base = slab.import_peer(it.peer, handle, deadline.remaining())?;
        bump(&self.counters.opens, 1);
        // A peer that recreated its slab: drop our reference to the old one.
        if let Some((old, _)) = st.peer_slabs.insert(key, (*handle, base)) {
            let _ = slab.release_peer(it.peer, &old);
            bump(&self.counters.closes, 1);
        }
        Ok(base)
    }

    fn fail(&self, items: &[Item], err: &Error) {
        let mut st = lock(&self.state);
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
        let st = lock(&self.state);
        let mut occ: u32 = 0;
        let mut any = false;
        while let Some(&i) = st.by_fp.get(&fingerprint_of(self.cfg.rank, req, occ)) {
            if !st.channels[i].key.is_of(self.cfg.rank, req, occ) {
                break;
            }
            any = true;
            let ch = &st.channels[i];
            let matches = ch
                .local
                .is_some_and(|l| l.ptr == req.ptr && l.bytes == req.bytes);
            if matches && ch.kind == req.kind {
                if let Some(err) = &ch.failed {
                    return Err(Error::state(format!(
                        "rank {}: {} failed in its last exchange: {}",
                        self.cfg.rank, ch.key, err.message
                    )));
                }
                let (Some(local), Some(peer)) = (&ch.local, &ch.peer_side) else {
                    break;
                };
                let t = self
                    .transport(ch.kind)
                    .expect("channel kinds have transports");
                return Ok(P2pHandles {
                    kind: ch.kind,
                    local_ptr: local.ptr,
                    local_bytes: local.bytes,
                    local_semaphore: t.semaphores().local(ch.slot)?,
                    peer_ptr: peer.mapping.ptr,
                    peer_bytes: peer.bytes,
                    peer_semaphore: peer.semaphore,
                    epochs: ch.epochs.clone(),
                    peer: ch.peer_board.as_ref().map_or(
                        PeerProcess {
                            rank: ch.peer,
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
        reclaim_dead_segments(&self.transports);
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
        let mut st = lock(&self.state);
        let channels = std::mem::take(&mut st.channels);
        st.by_fp.clear();
        let mut peers: BTreeMap<usize, bool> = BTreeMap::new();
        for ch in channels {
            *peers.entry(ch.peer).or_default() |= ch.kind == MemKind::Device;
            let t = self
                .transport(ch.kind)
                .expect("channel kinds have transports");
            if let Some(p) = ch.peer_side {
                self.release_mapping(ch.kind, &p.mapping);
            }
            if let Some(imp) = ch.resume.and_then(|r| r.staged) {
                self.release_mapping(imp.kind, &imp.mapping);
            }
            let _ = t.semaphores().free_slot(ch.slot);
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
        let deadline = Instant::now() + linger;
        let mut sleep = Duration::from_micros(50);
        loop {
            pending.retain(|&(peer, _)| !self.peer_let_go(peer));
            let now = Instant::now();
            if pending.is_empty() || now >= deadline {
                return pending;
            }
            std::thread::sleep(sleep.min(deadline - now));
            sleep = (sleep * 2).min(Duration::from_millis(5));
        }
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

/// Why a call's steps 2-4 failed: a peer not there in time (the step can be resumed), or
/// anything else (the channels are poisoned).
enum RunError {
    NotReady(Error, Vec<Option<Imported>>),
    Fatal(Error),
}

impl RunError {
    fn classify(e: Error, staged: Vec<Option<Imported>>) -> RunError {
        if e.status == Status::Timeout {
            RunError::NotReady(e, staged)
        } else {
            RunError::Fatal(e)
        }
    }
}

fn identity_of(local: &LocalBuffer) -> Identity {
    Identity {
        base: local.base,
        buffer_id: local.buffer_id,
        offset: local.offset(),
        bytes: local.bytes,
    }
}

struct Imported {
    kind: MemKind,
    mapping: Mapping,
    bytes: u64,
    sem_handle: ExportedHandle,
    sem_slot: u32,
}

impl Drop for HandleCache {
    fn drop(&mut self) {
        // Drop cannot report a timeout: it is counted in `teardowns_timed_out`.
        let _ = self.teardown();
    }
}

#[cfg(test)]
mod hot_path_tests {
    use super::*;

    #[test]
    fn peers_are_checked_for_liveness_only_past_the_spin_phase() {
        assert!(!(0..FIRST_LIVENESS_POLL).any(liveness_check_due));
        assert!(liveness_check_due(FIRST_LIVENESS_POLL));
        assert!(!liveness_check_due(FIRST_LIVENESS_POLL + 1));
        assert!(liveness_check_due(FIRST_LIVENESS_POLL + LIVENESS_EVERY));
    }

    #[test]
    fn the_deadline_starts_at_its_first_use_and_then_holds() {
        let mut d = Deadline::new(Duration::from_secs(60));
        assert!(d.at.is_none());
        let first = d.remaining();
        assert!(first > Duration::from_secs(59) && first <= Duration::from_secs(60));
        let at = d.at.expect("set by the first use");
        std::thread::sleep(Duration::from_millis(2));
        assert!(d.remaining() < first);
        assert_eq!(d.at, Some(at));
        assert_eq!(Deadline::new(Duration::ZERO).remaining(), Duration::ZERO);
    }

    #[test]
    fn fingerprints_hash_to_their_folded_halves() {
        let fp = (7u128 << 64) | 5;
        let mut h = FingerprintHasher::default();
        h.write_u128(fp);
        assert_eq!(h.finish(), 7 ^ 5);
        let mut by_fp = ByFingerprint::default();
        by_fp.insert(fp, 1);
        by_fp.insert(fp ^ (1 << 64), 2);
        assert_eq!(by_fp.get(&fp), Some(&1));
        assert_eq!(by_fp.get(&(fp ^ (1 << 64))), Some(&2));
    }
}
