//! One `exchange_handles` call: a [`Batch`] of channels and the exchange protocol it runs (its
//! steps numbered as in docs/PROTOCOL.md, section 5).
//!
//! A hit on both sides costs a few shared-memory loads, no store operation, no allocation and no
//! syscall. A call that times out because a peer is not there yet leaves its channels *suspended*
//! in that step: calling again with the same batch resumes it (so a zero timeout checks once). Any
//! other failure *fails* the batch: its channels refuse every later call (`InvalidState`).

use super::board::{BufferAt, PeerBoard};
use super::channel::{
    fingerprint_of, occurrence, Channel, ChannelInfo, ChannelKey, ChannelTable, PeerSide, Progress,
    Request, Resume,
};
use super::phases::{Lap, Phase};
use super::session::{bump, Held, Imported, Session};
use crate::error::{Error, Result, Status};
use crate::logging::{self, since};
use crate::os::wait::{blocking_pace, wait_blocking};
use crate::sync::lock;
use crate::transport::record::{self, flags, local_host, Record, NO_SLOT};
use crate::transport::{slot_address, ExportedHandle, LocalBuffer, MemKind, PeerMapping};
use log::Level;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The bound of a call's waits. The clock starts at the first wait that needs it, so a call whose
/// peers are already there never reads it. It keeps the call's timeout, for messages.
pub(super) struct Deadline {
    /// The call's whole timeout.
    pub(super) timeout: Duration,
    at: Option<Instant>,
}

impl Deadline {
    pub(super) fn new(timeout: Duration) -> Deadline {
        Deadline { timeout, at: None }
    }

    /// What is left of the timeout (zero once it has run out: a wait then checks once).
    pub(super) fn remaining(&mut self) -> Duration {
        let timeout = self.timeout;
        let at = *self.at.get_or_insert_with(|| Instant::now() + timeout);
        at.saturating_duration_since(Instant::now())
    }
}

/// At most `limit` keys, then how many more (keys can be many in a large batch).
fn some_keys<S: AsRef<str>>(keys: &[S], limit: usize) -> String {
    let mut out: Vec<String> = keys
        .iter()
        .take(limit)
        .map(|k| format!("{:?}", k.as_ref()))
        .collect();
    if keys.len() > limit {
        out.push(format!("and {} more", keys.len() - limit));
    }
    out.join(", ")
}

/// What a wait awaits of the peers: their step, or their open of this rank's buffer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Step,
    Open,
}

/// Reports a wait that lasts (after one second, then each time its length doubles), so that a
/// stuck exchange explains itself in the log while it hangs.
#[derive(Default)]
struct StuckReport {
    since: Option<Instant>,
    reported: u32,
}

impl StuckReport {
    /// Called now and then during a wait (not on its first poll, which usually succeeds).
    fn check(&mut self, rank: usize, items: &[Item], stage: Stage, timeout: Duration) {
        if !log::log_enabled!(target: logging::EXCHANGE, Level::Info) {
            return;
        }
        let waited = self.since.get_or_insert_with(Instant::now).elapsed();
        if waited < Duration::from_secs(1 << self.reported.min(30)) {
            return;
        }
        self.reported += 1;
        let pending: Vec<&Item> = items.iter().filter(|it| it.waiting).collect();
        for it in pending.iter().take(4) {
            let what = match stage {
                Stage::Step => format!(
                    "to reach step {} (board entry of {})",
                    it.progress.step,
                    it.ch.key.describe()
                ),
                Stage::Open => format!(
                    "to open version {} of this rank's buffer",
                    it.progress.version
                ),
            };
            log::info!(
                target: logging::EXCHANGE,
                "rank {rank}: still waiting after {:.1}s (timeout {timeout:?}) for peer rank {} \
                 on {} {what}",
                waited.as_secs_f64(),
                it.ch.peer,
                it.ch.key,
            );
        }
        if pending.len() > 4 {
            log::info!(
                target: logging::EXCHANGE,
                "rank {rank}: and {} more channel(s) pending",
                pending.len() - 4
            );
        }
    }
}

/// The channels of one call, claimed from the table until the batch ends, in items the caller
/// lends (reused per thread, so a warm call allocates nothing).
pub(super) struct Batch<'a> {
    cx: &'a Session,
    table: &'a Mutex<ChannelTable>,
    items: &'a mut Vec<Item>,
}

/// What an exchange is for, which decides how it resolves its buffers and whether its channels
/// carry semaphores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Resolution {
    /// Point-to-point exchanges: each buffer resolves to the allocation the transport shares for
    /// buffers carved nearby (a widened VMM run), so that a peer maps it once for all of them;
    /// each channel has a semaphore slot, which the peer maps (its P2P handles carry both).
    Shared,
    /// Symmetric rendezvous: the buffer's own allocation (views map what records name), and no
    /// semaphores (nothing posts on these channels), so a process that only rendezvous never
    /// allocates a semaphore slab nor maps its peers'.
    Exact,
}

/// Checks every request and resolves its buffer into `out`; nothing is changed on failure.
pub(super) fn resolve_all(
    cx: &Session,
    requests: &[Request],
    resolution: Resolution,
    out: &mut Vec<LocalBuffer>,
) -> Result<()> {
    for (i, r) in requests.iter().enumerate() {
        let local = resolve(cx, r, resolution)
            .map_err(|e| e.context(format!("rank {}: request {i} ({r})", cx.rank)))?;
        out.push(local);
    }
    Ok(())
}

fn resolve(cx: &Session, r: &Request, resolution: Resolution) -> Result<LocalBuffer> {
    if r.peer >= cx.world_size {
        return Err(Error::invalid(format!(
            "peer {} is not a rank of this world of {}",
            r.peer, cx.world_size
        )));
    }
    if r.peer == cx.rank {
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
    let t = cx.transports.get_or_make(r.kind)?;
    match resolution {
        Resolution::Shared => t.resolve_shared(r.ptr, r.bytes),
        Resolution::Exact => t.resolve(r.ptr, r.bytes),
    }
}

impl<'a> Batch<'a> {
    /// Step 1: claims the channels of `requests` (whose buffers `resolved` holds) and advances
    /// their step (and version), or resumes a suspended step. Nothing is claimed on failure.
    pub(super) fn begin(
        cx: &'a Session,
        table: &'a Mutex<ChannelTable>,
        requests: &[Request],
        (resolved, resolution): (&[LocalBuffer], Resolution),
        indices: &mut Vec<usize>,
        items: &'a mut Vec<Item>,
    ) -> Result<Batch<'a>> {
        let rank = cx.rank;
        let mut st = lock(table);
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
                    let entry = cx.board.insert(fp)?;
                    let slot = match resolution {
                        Resolution::Shared => {
                            cx.channel_transport(r.kind).semaphores().allocate_slot()?
                        }
                        Resolution::Exact => NO_SLOT,
                    };
                    st.channels.push(Channel::new(ChannelInfo {
                        key: ChannelKey::of(rank, r, occ),
                        peer: r.peer,
                        kind: r.kind,
                        slot,
                        entry,
                        fp,
                    }));
                    let i = st.channels.len() - 1;
                    st.by_fp.insert(fp, i);
                    i
                }
            };
            let ch = &st.channels[idx];
            if let Some(err) = &ch.failed {
                return Err(Error::state(format!(
                    "rank {rank}: {} failed earlier ({}); its state is unknown: create a new cache",
                    ch.info.key, err.message
                )));
            }
            let Some(progress) = &ch.progress else {
                return Err(Error::state(format!(
                    "rank {rank}: {} is being exchanged by another thread; calls on the same \
                     channel must not overlap",
                    ch.info.key
                )));
            };
            if ch.info.kind != r.kind {
                return Err(Error::invalid(format!(
                    "rank {rank}: {} was used with {} memory and now with {}: a channel keeps its \
                     memory kind (use another tag)",
                    ch.info.key,
                    ch.info.kind.name(),
                    r.kind.name()
                )));
            }
            // A suspended step resumes with the buffer it started with.
            if progress.resume.is_some() && !ch.holds(&resolved[n]) {
                return Err(Error::invalid(format!(
                    "rank {rank}: {} timed out waiting for its peer at step {} and must be \
                     resumed with the same buffer; call again with the buffer of that call",
                    ch.info.key, progress.step
                )));
            }
            indices.push(idx);
        }
        // Pass 2: advance (or resume), moving each channel's progress into its item.
        for (&idx, &local) in indices.iter().zip(resolved) {
            let ch = &mut st.channels[idx];
            let changed = !ch.holds(&local);
            if changed {
                ch.validity.bump();
            }
            ch.local = Some(local);
            let mut progress = ch.progress.take().expect("checked in pass 1");
            let state = match progress.resume.take() {
                Some(r) => *r,
                None => {
                    if changed {
                        progress.version += 1;
                    }
                    progress.step += 1;
                    let publish = progress.version != progress.published;
                    Resume {
                        publish,
                        ..Resume::default()
                    }
                }
            };
            items.push(Item {
                channel: idx,
                ch: ch.info.clone(),
                local,
                progress,
                peer_version: 0,
                peer_at: Default::default(),
                waiting: false,
                state,
            });
        }
        Ok(Batch { cx, table, items })
    }

    /// Steps 2-7: runs the protocol on the batch's channels and ends the batch.
    pub(super) fn exchange(self, deadline: &mut Deadline, mut lap: Lap<'_>) -> Result<()> {
        // A cached call is logged at TRACE, one that moved records (or failed) at INFO.
        let clock = logging::clock(logging::EXCHANGE, Level::Info);
        match self.cx.run(&mut self.items[..], deadline, &mut lap) {
            Ok(imports) => {
                let done = self.commit(imports, clock, deadline);
                lap.mark(Phase::Commit);
                if done.is_ok() {
                    lap.finish();
                }
                done
            }
            Err(e) => Err(self.abort(e, clock)),
        }
    }

    /// Step 6, its end: moves the new peer mappings' guards into their channels, dropping (or
    /// retaining) the ones they replace, and gives every channel its progress back.
    fn commit(
        self,
        imports: Vec<Option<Imported>>,
        clock: Option<Instant>,
        deadline: &mut Deadline,
    ) -> Result<()> {
        let cx = self.cx;
        let opened = imports.iter().filter(|i| i.is_some()).count();
        let published = self.items.iter().filter(|it| it.state.publish).count();
        let first = clock.and(self.items.first()).map(|it| {
            let (step, version) = (it.progress.step, it.progress.version);
            format!(" (first: {} step {step} version {version})", it.ch.key)
        });
        let mut hits = 0;
        let mut released: Vec<(MemKind, Held)> = Vec::new();
        {
            let mut st = lock(self.table);
            // `imports` is empty when nothing was imported.
            let mut imports = imports.into_iter();
            for it in self.items.iter_mut() {
                let imp = imports.next().flatten();
                let fetched = imp.is_some();
                let ch = &mut st.channels[it.channel];
                if let Some(imp) = imp {
                    // Before the replaced mapping is dropped below.
                    ch.validity.bump();
                    let mut held = lock(&cx.holdings);
                    held.known.learn(it.ch.peer, it.ch.kind, &imp.record);
                    it.progress.peer_record = Some(Box::new(imp.record));
                    let old = ch.peer_side.replace(PeerSide {
                        mapping: imp.mapping,
                        bytes: imp.bytes,
                        semaphore: imp.semaphore,
                    });
                    it.progress.peer_opened = it.peer_version;
                    if let Some(old) = old {
                        let limit = cx.settings.retained_per_peer.load(Ordering::Relaxed);
                        for m in held.retained.retire(it.ch.kind, old.mapping, limit) {
                            released.push((it.ch.kind, m));
                        }
                    }
                }
                if it.state.publish {
                    it.progress.published = it.progress.version;
                }
                ch.progress = Some(std::mem::take(&mut it.progress));
                if !it.state.publish && !fetched {
                    hits += 1;
                }
            }
            if !released.is_empty() {
                forget_released(cx, &st, &released);
            }
        }
        // Dropped outside the table's lock (a host mapping is unmapped here).
        let replaced = released.len();
        drop(released);
        bump(&cx.counters.hits, hits);
        let misses = self.items.len() as u64 - hits;
        if misses > 0 {
            bump(&cx.counters.misses, misses);
        }
        bump(&cx.counters.exchanges, 1);
        if clock.is_some() {
            let level = match published + opened + replaced {
                0 => Level::Trace,
                _ => Level::Info,
            };
            log::log!(
                target: logging::EXCHANGE,
                level,
                "rank {}: exchange of {} channel(s) done in {}: {published} published, \
                 {opened} opened, {replaced} released{}",
                cx.rank,
                self.items.len(),
                since(clock),
                first.unwrap_or_default()
            );
        }
        if replaced == 0 {
            return Ok(());
        }
        // Back-pressure: the device transport closes released mappings on its releaser thread,
        // and the call waits for it, within its timeout, only when more than its bound of one
        // peer's wait. A timeout fails the call without poisoning its channels.
        let items = &self.items[..];
        for (i, it) in items.iter().enumerate() {
            // One wait per (kind, peer) of the batch.
            if items[..i]
                .iter()
                .any(|o| o.ch.peer == it.ch.peer && o.ch.kind == it.ch.kind)
            {
                continue;
            }
            self.cx
                .channel_transport(it.ch.kind)
                .wait_release_room(it.ch.peer, deadline.remaining())
                .map_err(|e| {
                    e.context(format!(
                        "rank {}: {} (exchange timeout {:?}; its handles are current, the \
                         replaced mappings stay queued)",
                        self.cx.rank, it.ch.key, deadline.timeout
                    ))
                })?;
        }
        Ok(())
    }

    /// Ends a failed batch: suspended after a `NotReady`, for the next call with the same batch to
    /// resume; else failed, its channels' state unknown, refusing every later call.
    fn abort(self, e: RunError, clock: Option<Instant>) -> Error {
        let (err, staged) = match e {
            RunError::NotReady(err, staged) => (err, Some(staged)),
            RunError::Fatal(err) => (err, None),
        };
        let suspended = staged.is_some();
        let mut staged = staged.into_iter().flatten();
        let mut st = lock(self.table);
        for it in self.items.iter_mut() {
            let ch = &mut st.channels[it.channel];
            if !suspended {
                ch.validity.fail();
                ch.failed = Some(err.clone());
                continue;
            }
            let mut progress = std::mem::take(&mut it.progress);
            it.state.staged = staged.next().flatten();
            progress.resume = Some(Box::new(std::mem::take(&mut it.state)));
            ch.progress = Some(progress);
        }
        drop(st);
        let (what, then) = match suspended {
            true => ("suspended", "resumable with the same batch"),
            false => ("failed", "its channels are unusable"),
        };
        log::info!(
            target: logging::EXCHANGE,
            "rank {}: exchange of {} channel(s) {what} after {}, {then}: {}",
            self.cx.rank,
            self.items.len(),
            since(clock),
            err.message
        );
        err
    }
}

/// Takes the allocations whose last mapping in this cache is about to be dropped off the board
/// lists of the channels of their peer: the peer sends records of them through the store again.
fn forget_released(cx: &Session, st: &ChannelTable, released: &[(MemKind, Held)]) {
    let held = lock(&cx.holdings);
    for (kind, m) in released {
        let same = |o: &PeerMapping| o.peer() == m.peer() && o.buffer_id() == m.buffer_id();
        let still_mapped = held.retained.holds(*kind, m)
            || st.channels.iter().any(|c| {
                c.info.kind == *kind && c.peer_side.as_ref().is_some_and(|p| same(&p.mapping))
            });
        if still_mapped {
            continue;
        }
        for c in st
            .channels
            .iter()
            .filter(|c| c.info.peer == m.peer() && c.info.kind == *kind)
        {
            cx.board.forget_known(c.info.entry, m.buffer_id());
        }
    }
}

/// Work of one request in one call; its progress is moved out of the table and back.
pub(super) struct Item {
    /// Index in the table.
    pub channel: usize,
    pub ch: Arc<ChannelInfo>,
    pub local: LocalBuffer,
    pub progress: Progress,
    pub peer_version: u64,
    /// Where the peer's buffer of `peer_version` lies (from its board).
    pub peer_at: BufferAt,
    /// Still waited for by the current wait (peer's step, then peer's open).
    pub waiting: bool,
    /// What this step did so far (a suspended step's, when resumed).
    pub state: Resume,
}

/// Why a call's steps 2-6 failed: a peer not there in time (resumable), or anything else.
pub(super) enum RunError {
    NotReady(Error, Vec<Option<Imported>>),
    Fatal(Error),
}

/// Polls of a board wait before the first liveness check of the peers (a syscall), so that a peer
/// a few microseconds late costs none; once the wait blocks, every wake-up makes one.
const FIRST_LIVENESS_POLL: u32 = 2048;
/// Polls between two liveness checks while spinning past that.
const LIVENESS_EVERY: u32 = 256;

/// How long a wait sleeps between two looks for a peer board that does not exist yet.
const NO_BOARD_SLEEP: Duration = Duration::from_millis(1);

fn liveness_check_due(polls: u32) -> bool {
    polls >= FIRST_LIVENESS_POLL && polls % LIVENESS_EVERY == 0
}

/// A timeout leaves `imports` to the step that resumes; any other failure drops them.
fn give_up(e: Error, imports: Vec<Option<Imported>>) -> RunError {
    if e.status == Status::Timeout {
        return RunError::NotReady(e, imports);
    }
    RunError::Fatal(e)
}

/// Steps 2-6 of a call, over the cache's context.
impl Session {
    fn run(
        &self,
        items: &mut [Item],
        deadline: &mut Deadline,
        lap: &mut Lap<'_>,
    ) -> std::result::Result<Vec<Option<Imported>>, RunError> {
        // A peer whose board is not here yet may never have one here (another host or
        // container): refuse it before anything is published (one store round trip, per peer).
        let mut unknown: Vec<usize> = Vec::new();
        for it in items
            .iter_mut()
            .filter(|it| it.progress.link.board.is_none())
        {
            if self.peer_nodes.known(it.ch.peer) {
                continue;
            }
            match self.peer_board(it.ch.peer) {
                Ok(Some(board)) => it.progress.link.board = Some(board),
                _ => unknown.push(it.ch.peer),
            }
        }
        if !unknown.is_empty() {
            bump(&self.counters.peer_lookups, 1);
            self.peer_nodes
                .check(
                    &*self.store,
                    &self.names,
                    self.rank,
                    &unknown,
                    deadline.remaining(),
                )
                .map_err(|e| give_up(e, Vec::new()))?;
        }
        lap.mark(Phase::Lookup);
        // Records go out before the step is visible on the board, so that a peer's multi_get never
        // waits on this rank's progress (several threads may share one store client).
        self.send_records(items, lap).map_err(RunError::Fatal)?;
        for it in items.iter_mut() {
            it.state.sent = true;
        }
        lap.mark(Phase::Records);
        for it in items.iter() {
            let at = BufferAt {
                alloc_id: it.local.buffer_id,
                offset: it.local.offset(),
                bytes: it.local.bytes,
                known_to_peer: it.state.publish && it.state.known_to_peer,
            };
            self.board
                .publish(it.ch.entry, it.progress.step, it.progress.version, at);
        }
        lap.mark(Phase::Publish);
        let staged =
            |items: &mut [Item]| items.iter_mut().map(|it| it.state.staged.take()).collect();
        if let Err(e) = self.wait(items, Stage::Step, deadline) {
            return Err(give_up(e, staged(items)));
        }
        lap.mark(Phase::WaitPeers);
        // Records are sent without waiting for the store's reply, so a peer's step can be visible
        // before its records are: a zero timeout may miss them, which is retryable.
        let mut imports = self
            .fetch_records(items, deadline, lap)
            .map_err(|e| give_up(e, staged(items)))?;
        lap.mark(Phase::Import);
        // Everything of the peer this rank needs is mapped before it says so: a peer that has
        // seen `opened` may return, and exit, and its memory is passed by its own process.
        // On failure the imports' guards are dropped.
        self.map_peer_slabs(items, &mut imports, deadline)
            .map_err(RunError::Fatal)?;
        for (it, imp) in items.iter_mut().zip(&imports) {
            if let Some(imp) = imp {
                // The list changes before `opened` says the step is done (see `peers`).
                let listed = self.board.known(it.ch.entry);
                let ids = it.progress.held.imported(&listed, &imp.record);
                self.board.set_known(it.ch.entry, &ids);
                self.board.publish_opened(it.ch.entry, it.peer_version);
            }
        }
        lap.mark(Phase::Slabs);
        if let Err(e) = self.wait(items, Stage::Open, deadline) {
            return Err(give_up(e, imports));
        }
        lap.mark(Phase::WaitOpened);
        Ok(imports)
    }

    fn send_records(&self, items: &mut [Item], lap: &mut Lap<'_>) -> Result<()> {
        let mut pairs: Vec<(String, Vec<u8>)> = Vec::new();
        for it in items
            .iter_mut()
            .filter(|it| it.state.publish && !it.state.sent)
        {
            // Read before this step is published, so exact (see `peers`).
            let knows = |it: &Item, id: u64| match (&it.progress.link.board, it.progress.link.entry)
            {
                (Some(b), Some(e)) => b.knows(e, id),
                _ => false,
            };
            it.state.known_to_peer = knows(it, it.local.buffer_id);
            if !it.state.known_to_peer {
                // Exported only as mapped now (a widened VMM run may have lost a neighbour
                // since it was remembered; see `cuda::vmm_runs`).
                let fresh = self
                    .channel_transport(it.ch.kind)
                    .refresh(&it.local)
                    .map_err(|e| {
                        e.context(format!(
                            "rank {}: resolving the buffer of {} again",
                            self.rank, it.ch.key
                        ))
                    })?;
                if fresh != it.local {
                    it.local = fresh;
                    it.state.known_to_peer = knows(it, fresh.buffer_id);
                }
            }
            if it.state.known_to_peer {
                continue;
            }
            let rec = self.make_record(it).map_err(|e| {
                e.context(format!(
                    "rank {}: exporting the buffer of {}",
                    self.rank, it.ch.key
                ))
            })?;
            let key = self.record_key(it, true);
            let (notice, sealed) = self
                .channel_transport(it.ch.kind)
                .seal_record(&key, &rec.encode())
                .map_err(|e| e.context(format!("rank {}: offering the record {key}", self.rank)))?;
            it.progress.sealed = Some(sealed);
            pairs.push((key, notice));
        }
        lap.mark(Phase::Export);
        if pairs.is_empty() {
            return Ok(());
        }
        let refs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        bump(&self.counters.store_round_trips, 1);
        let clock = logging::clock(logging::EXCHANGE, Level::Info);
        self.store.multi_set(&refs).map_err(|e| {
            e.context(format!(
                "rank {}: publishing {} record(s) (first key {})",
                self.rank,
                pairs.len(),
                pairs[0].0
            ))
        })?;
        bump(&self.counters.records_sent, pairs.len() as u64);
        let bytes: usize = pairs.iter().map(|(_, v)| v.len()).sum();
        bump(&self.counters.record_bytes_sent, bytes as u64);
        if clock.is_some() {
            let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
            log::info!(
                target: logging::EXCHANGE,
                "rank {}: sent {} record(s) ({bytes} bytes) to the store in {}: {}",
                self.rank,
                pairs.len(),
                since(clock),
                some_keys(&keys, 4)
            );
        }
        Ok(())
    }

    /// The store key of this rank's (`own`) or the peer's record of `it` at its version.
    fn record_key(&self, it: &Item, own: bool) -> String {
        let (exporter, version) = match own {
            true => (self.rank, it.progress.version),
            false => (it.ch.peer, it.peer_version),
        };
        it.ch.key.record_key(&self.names, exporter, version)
    }

    fn make_record(&self, it: &Item) -> Result<Record> {
        let t = self.channel_transport(it.ch.kind);
        let handle = t.export(&it.local)?;
        let slab = match it.ch.slot {
            NO_SLOT => ExportedHandle::plain(handle.handle_type, [0; record::PAYLOAD_LEN]),
            _ => t.semaphores().export()?,
        };
        let host = local_host();
        Ok(Record {
            handle_type: handle.handle_type,
            flags: if it.ch.kind == MemKind::Device {
                flags::DEVICE
            } else {
                0
            },
            offset: it.local.offset(),
            bytes: it.local.bytes,
            alloc_bytes: it.local.alloc_bytes,
            buffer_id: it.local.buffer_id,
            host_id: host.id,
            version: it.progress.version,
            device_uuid: it.local.device_uuid,
            pid: std::process::id(),
            rank: self.rank as u32,
            host_name: record::to_fixed(&host.name).unwrap_or([0; record::HOST_NAME_LEN]),
            payload: handle.payload,
            sem_type: slab.handle_type,
            sem_slot: it.ch.slot,
            sem_payload: slab.payload,
            segments: handle.segments,
        })
    }

    /// Maps the peers' semaphore slabs not mapped yet, and gives each import its semaphore here.
    fn map_peer_slabs(
        &self,
        items: &[Item],
        imports: &mut [Option<Imported>],
        deadline: &mut Deadline,
    ) -> Result<()> {
        let mut held = lock(&self.holdings);
        for (it, imp) in items.iter().zip(imports.iter_mut()) {
            let Some(imp) = imp.as_mut().filter(|imp| imp.sem_slot != NO_SLOT) else {
                continue;
            };
            let key = (it.ch.peer, it.ch.kind);
            let base = match held.slabs.get(&key) {
                Some((h, slab)) if *h == imp.sem_handle => slab.base(),
                _ => {
                    let slab = self
                        .channel_transport(it.ch.kind)
                        .semaphores()
                        .import_peer(it.ch.peer, &imp.sem_handle, deadline.remaining())
                        .map_err(|e| {
                            e.context(format!(
                                "rank {}: mapping peer rank {}'s semaphore slab for {}",
                                self.rank, it.ch.peer, it.ch.key
                            ))
                        })?;
                    let slab = Held::new(slab, &self.counters);
                    let base = slab.base();
                    // A peer that recreated its slab: the guard of the old one is dropped.
                    held.slabs.insert(key, (imp.sem_handle.clone(), slab));
                    base
                }
            };
            imp.semaphore = slot_address(base, imp.sem_slot);
        }
        Ok(())
    }

    /// Step 4 (`Step`): waits until every peer has reached this call's step on its channel, and
    /// reads its version; step 6 (`Open`): until the peer has opened every buffer this rank
    /// published. Now and then (about every 100 ms once sleeping) it checks that the awaited peers
    /// still exist and have not closed their caches, so that it fails at once when one has.
    fn wait(&self, items: &mut [Item], stage: Stage, deadline: &mut Deadline) -> Result<()> {
        let mut left = 0;
        for it in items.iter_mut() {
            it.waiting = stage == Stage::Step || it.state.publish;
            left += usize::from(it.waiting);
        }
        if left == 0 {
            return Ok(());
        }
        let mut error: Option<Error> = None;
        let mut polls: u32 = 0;
        let mut stuck = StuckReport::default();
        let timeout = deadline.timeout;
        let mut poll = |after_block: bool, items: &mut [Item]| {
            polls = polls.wrapping_add(1);
            // Checked before the entries: what a peer published before it closed or exited is
            // visible once its `closed` flag or its death is, and then it is no failure.
            let due = after_block || liveness_check_due(polls);
            let gone = if due {
                stuck.check(self.rank, items, stage, timeout);
                self.gone_peer(items, stage)
            } else {
                None
            };
            for it in items.iter_mut().filter(|it| it.waiting) {
                match self.ready(it, stage) {
                    Ok(true) => {
                        it.waiting = false;
                        left -= 1;
                    }
                    Ok(false) => {}
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            // A truncated board first: a peer that failed on it may have closed since, and the
            // truncation is what the user must hear about.
            if error.is_none() {
                error = self.boards_intact(items, due).err();
            }
            if error.is_none() {
                error = gone.and_then(|(i, e)| items[i].waiting.then_some(e));
            }
            (left == 0 || error.is_some()).then_some(())
        };
        // Peers usually are there already: then the clock is never read.
        if poll(false, items).is_none() {
            let pace = blocking_pace(lock(&self.peer_boards).len() + 1);
            wait_blocking(pace, deadline.remaining(), |block| {
                let Some(max) = block else {
                    return poll(false, items);
                };
                // Blocks on the board of the first peer still awaited, until it publishes; the
                // others are checked when it wakes this rank.
                let board = items
                    .iter()
                    .find(|it| it.waiting)
                    .and_then(|it| it.progress.link.board.clone());
                let mut done = None;
                match board {
                    Some(b) => b.block(max, || {
                        done = poll(false, items);
                        done.is_none()
                    }),
                    // Its board is not there yet: nothing to block on.
                    None => std::thread::sleep(max.min(NO_BOARD_SLEEP)),
                }
                done.or_else(|| poll(true, items))
            });
        }
        if let Some(e) = error {
            return Err(e);
        }
        // A wait that timed out may have seen the last item get ready in its final check.
        let pending = items.iter().filter(|it| it.waiting).count();
        match items.iter().find(|it| it.waiting) {
            None => Ok(()),
            Some(it) => Err(self.late(it, stage, pending, deadline.timeout)),
        }
    }

    /// Whether the peer of `it` has reached `stage` (at `Step`, reading its version).
    fn ready(&self, it: &mut Item, stage: Stage) -> Result<bool> {
        let link = &mut it.progress.link;
        if stage == Stage::Open {
            return Ok(match (&link.board, link.entry) {
                (Some(b), Some(e)) => b.opened(e) >= it.progress.version,
                _ => false,
            });
        }
        if link.board.is_none() {
            link.board = self
                .peer_board(it.ch.peer)
                .map_err(|e| e.context(format!("rank {}", self.rank)))?;
        }
        let Some(board) = &link.board else {
            return Ok(false);
        };
        if link.entry.is_none() {
            link.entry = board.find(it.ch.fp);
        }
        let Some((version, at)) = link.entry.and_then(|e| board.read(e, it.progress.step)) else {
            return Ok(false);
        };
        it.peer_version = version;
        it.peer_at = at;
        Ok(true)
    }

    /// The error of a wait that timed out with `it` the first of `pending` items still late.
    fn late(&self, it: &Item, stage: Stage, pending: usize, timeout: Duration) -> Error {
        let board = self.names.board(it.ch.peer);
        let (step, key) = (it.progress.step, it.ch.key.describe());
        Error::timeout(match stage {
            Stage::Step => {
                let seen = match (self.peer_board(it.ch.peer), it.progress.link.entry) {
                    (Ok(Some(b)), Some(e)) => format!("its entry is at step {}", b.step(e)),
                    (Ok(Some(_)), None) => "it has not used this channel yet".to_string(),
                    _ => "its board does not exist yet (has it created its cache?)".to_string(),
                };
                format!(
                    "rank {} timed out after {timeout:?} waiting for peer rank {} on {} at step \
                     {step}: board entry {key} of {board} not at step {step} ({seen}); {} other \
                     channel(s) also pending. Does rank {} call exchange_handles with the \
                     matching request?",
                    self.rank,
                    it.ch.peer,
                    it.ch.key,
                    pending - 1,
                    it.ch.peer,
                )
            }
            Stage::Open => {
                let opened = match (&it.progress.link.board, it.progress.link.entry) {
                    (Some(b), Some(e)) => b.opened(e),
                    _ => 0,
                };
                format!(
                    "rank {} timed out after {timeout:?} waiting for peer rank {} to open version \
                     {} of this rank's buffer on {} at step {step} (board entry {key} of {board} \
                     shows version {opened} opened; key {:?}); did the peer fail in \
                     exchange_handles?",
                    self.rank,
                    it.ch.peer,
                    it.progress.version,
                    it.ch.key,
                    self.record_key(it, true),
                )
            }
        })
    }

    /// Fails when this rank's board, or the board of a peer still awaited, was truncated (it reads
    /// zeros from then on, so a wait on it would last until the timeout); `probe`: see `board`.
    fn boards_intact(&self, items: &[Item], probe: bool) -> Result<()> {
        self.board
            .check(probe)
            .and_then(|()| {
                items
                    .iter()
                    .filter(|it| it.waiting)
                    .filter_map(|it| it.progress.link.board.as_deref())
                    .try_for_each(|b| b.check(probe))
            })
            .map_err(|e| e.context(format!("rank {}", self.rank)))
    }

    /// The first pending item whose peer has closed its cache or exited, with the error.
    fn gone_peer(&self, items: &[Item], stage: Stage) -> Option<(usize, Error)> {
        items.iter().enumerate().find_map(|(i, it)| {
            if !it.waiting {
                return None;
            }
            let (who, key, step) = (it.ch.peer, &it.ch.key, it.progress.step);
            let waited_for = || match stage {
                Stage::Step => format!("reaching step {step} on {key}"),
                Stage::Open => format!(
                    "opening version {} of this rank's buffer on {key} at step {step}",
                    it.progress.version
                ),
            };
            let Some(board) = it.progress.link.board.as_ref() else {
                // Its board was never seen here (it may have died before this rank looked, and
                // its board gone with it): its process, as its cache published it.
                let pid = self.peer_nodes.exited(who)?;
                return Some((
                    i,
                    Error::io(format!(
                        "rank {}: peer rank {who} (pid {pid}) exited before {}; its cache had \
                         been created, its board is gone",
                        self.rank,
                        waited_for()
                    )),
                ));
            };
            if board.closed() {
                return Some((i, self.closed_peer(it, board, &waited_for())));
            }
            (board.owner().is_dead()).then(|| {
                let msg = format!(
                    "rank {}: peer rank {who} (pid {}) exited before {}",
                    self.rank,
                    board.owner().pid,
                    waited_for()
                );
                (i, Error::io(msg))
            })
        })
    }

    /// The error of a peer whose board says it closed its cache before `what`.
    fn closed_peer(&self, it: &Item, board: &PeerBoard, what: &str) -> Error {
        Error::state(format!(
            "rank {}: peer rank {} (pid {}) closed its cache before {what}; a closed cache takes \
             no part in exchanges (create new caches on both ranks)",
            self.rank,
            it.ch.peer,
            board.owner().pid,
        ))
    }

    /// Refuses to import a record of a peer that has closed its cache (it may free that memory).
    fn refuse_closed_peer(&self, it: &Item, key: &str) -> Result<()> {
        match &it.progress.link.board {
            Some(b) if b.closed() => Err(self.closed_peer(
                it,
                b,
                &format!("this rank opened its record {key:?} for {}", it.ch.key),
            )),
            _ => Ok(()),
        }
    }

    /// Step 5: fetches and imports the records of peers whose version changed. Returns the
    /// imports by item index (none when every peer is cached); on failure, what was opened goes
    /// back to its item.
    fn fetch_records(
        &self,
        items: &mut [Item],
        deadline: &mut Deadline,
        lap: &mut Lap<'_>,
    ) -> Result<Vec<Option<Imported>>> {
        if items
            .iter()
            .all(|it| it.peer_version == it.progress.peer_opened && it.state.staged.is_none())
        {
            return Ok(Vec::new());
        }
        // A resumed step already opened these (the peer's version at a step never changes).
        let mut imports: Vec<Option<Imported>> =
            items.iter_mut().map(|it| it.state.staged.take()).collect();
        let done = self.import_wanted(items, &mut imports, deadline, lap);
        if done.is_err() {
            for (it, imp) in items.iter_mut().zip(&mut imports) {
                it.state.staged = imp.take();
            }
        }
        done.map(|()| imports)
    }

    fn import_wanted(
        &self,
        items: &[Item],
        imports: &mut [Option<Imported>],
        deadline: &mut Deadline,
        lap: &mut Lap<'_>,
    ) -> Result<()> {
        let wanted: Vec<usize> = (0..items.len())
            .filter(|&i| {
                items[i].peer_version != items[i].progress.peer_opened && imports[i].is_none()
            })
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let wanted = self.import_known(items, &wanted, imports, deadline)?;
        lap.mark(Phase::ImportKnown);
        if wanted.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = wanted
            .iter()
            .map(|&i| self.record_key(&items[i], false))
            .collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        bump(&self.counters.store_round_trips, 1);
        let remaining = deadline.remaining();
        let clock = logging::clock(logging::EXCHANGE, Level::Info);
        let fetched = self.store.multi_get(&key_refs, remaining);
        lap.mark(Phase::Fetch);
        if clock.is_some() {
            log::info!(
                target: logging::EXCHANGE,
                "rank {}: fetching {} record(s) from the store took {} ({}): {}",
                self.rank,
                keys.len(),
                since(clock),
                match &fetched {
                    Ok(_) => "found",
                    Err(e) if e.status == Status::Timeout => "not there yet",
                    Err(_) => "failed",
                },
                some_keys(&keys, 4)
            );
        }
        let values = fetched.map_err(|e| {
            let it = &items[wanted[0]];
            Error::new(
                e.status,
                format!(
                    "rank {}: fetching {} record(s) from the store failed after at most {:?}: \
                     first: peer rank {}'s record for {} at step {}, version {}, key {:?}: {}",
                    self.rank,
                    keys.len(),
                    deadline.timeout,
                    it.ch.peer,
                    it.ch.key,
                    it.progress.step,
                    it.peer_version,
                    keys[0],
                    e.message
                ),
            )
        })?;
        if values.len() != keys.len() {
            return Err(Error::protocol(format!(
                "rank {}: the store returned {} values for {} keys",
                self.rank,
                values.len(),
                keys.len()
            )));
        }
        lock(&self.collector).delete(keys.clone());
        let wait = deadline.remaining();
        for ((&i, value), key) in wanted.iter().zip(&values).zip(&keys) {
            self.refuse_closed_peer(&items[i], key)?;
            imports[i] = Some(self.import(&items[i], value, key, wait)?);
        }
        bump(&self.counters.records_received, wanted.len() as u64);
        Ok(())
    }

    /// Imports, without the store, the wanted items whose peer buffer lies inside an allocation
    /// whose record this rank already holds (see `peers`); the collector deletes the records the
    /// peer sent all the same. Returns the items left to fetch from the store.
    fn import_known(
        &self,
        items: &[Item],
        wanted: &[usize],
        imports: &mut [Option<Imported>],
        deadline: &mut Deadline,
    ) -> Result<Vec<usize>> {
        // (record, whether it is the channel's own kept record).
        let records: Vec<Option<(Record, bool)>> = {
            let held = lock(&self.holdings);
            wanted
                .iter()
                .map(|&i| {
                    let it = &items[i];
                    let channel = it.progress.peer_record.as_deref()?;
                    if it.peer_at.known_to_peer {
                        // Never written to the store: no key to delete either.
                        let at = it.peer_at;
                        return it
                            .progress
                            .held
                            .record_for(at.alloc_id, at.offset, at.bytes, it.peer_version, channel)
                            .map(|rec| (rec, true));
                    }
                    let pid = it.progress.link.board.as_ref()?.owner().pid;
                    // The version this channel last imported, whose mapping was released since
                    // (`symmetric_release`): its record was read and deleted already.
                    if channel.version == it.peer_version && channel.pid == pid {
                        return Some((channel.clone(), true));
                    }
                    let at = it.peer_at;
                    held.known
                        .record_for(
                            (it.ch.peer, pid, it.ch.kind, at.alloc_id),
                            at.offset,
                            at.bytes,
                            it.peer_version,
                            channel,
                        )
                        .map(|rec| (rec, false))
                })
                .collect()
        };
        let mut rest = Vec::new();
        let mut keys = Vec::new();
        let mut board_only = 0;
        for (&i, rec) in wanted.iter().zip(records) {
            let it = &items[i];
            let key = self.record_key(it, false);
            let Some((rec, kept)) = rec else {
                if it.peer_at.known_to_peer {
                    // The two sides disagree on what this rank holds.
                    return Err(Error::protocol(format!(
                        "rank {}: peer rank {} published version {} of its buffer on {} \
                         (allocation {}, offset {}, {} bytes) without a record, as one this rank \
                         holds, but this rank holds no record of that allocation for the channel \
                         (no key {key:?} in the store either); all ranks must use the same \
                         nvfuser-ipc version: create new caches on both ranks",
                        self.rank,
                        it.ch.peer,
                        it.peer_version,
                        it.ch.key,
                        it.peer_at.alloc_id,
                        it.peer_at.offset,
                        it.peer_at.bytes,
                    )));
                }
                rest.push(i);
                continue;
            };
            self.refuse_closed_peer(it, &key)?;
            imports[i] = Some(self.import_record(it, rec, &key, deadline.remaining())?);
            if it.peer_at.known_to_peer {
                board_only += 1;
            } else if !kept {
                keys.push(key);
            }
        }
        bump(&self.counters.records_known, board_only);
        if !keys.is_empty() {
            bump(&self.counters.records_known, keys.len() as u64);
            lock(&self.collector).delete_when_written(keys);
        }
        Ok(rest)
    }

    fn record_context(&self, it: &Item, key: &str) -> String {
        let (rank, peer) = (self.rank, it.ch.peer);
        format!(
            "rank {rank}: record {key:?} of peer rank {peer} for {}",
            it.ch.key
        )
    }

    fn import(&self, it: &Item, value: &[u8], key: &str, wait: Duration) -> Result<Imported> {
        let ctx = || self.record_context(it, key);
        // The store holds only a notice: the record comes from the peer's own process.
        let opened = self
            .channel_transport(it.ch.kind)
            .open_record(it.ch.peer, key, value, wait);
        let bytes = match opened {
            Ok(bytes) => bytes,
            Err(e) => {
                // Say the cause where it is known: the peer closed its cache or exited meanwhile.
                self.refuse_closed_peer(it, key)?;
                if let Some(pid) = self.peer_nodes.exited(it.ch.peer) {
                    return Err(Error::io(format!(
                        "{}: peer rank {} (pid {pid}) exited before this rank read its record \
                         ({})",
                        ctx(),
                        it.ch.peer,
                        e.message
                    )));
                }
                return Err(e.context(ctx()));
            }
        };
        let rec = Record::decode(&bytes).map_err(|e| e.context(ctx()))?;
        if rec.rank as usize != it.ch.peer || rec.version != it.peer_version {
            return Err(Error::protocol(format!(
                "{}: holds rank {} version {}, expected rank {} version {}",
                ctx(),
                rec.rank,
                rec.version,
                it.ch.peer,
                it.peer_version
            )));
        }
        self.import_record(it, rec, key, wait)
    }

    /// Maps the buffer that `rec` (checked: the peer's, at the version wanted) describes.
    fn import_record(&self, it: &Item, rec: Record, key: &str, wait: Duration) -> Result<Imported> {
        let ctx = || self.record_context(it, key);
        let is_device = rec.flags & flags::DEVICE != 0;
        if is_device != (it.ch.kind == MemKind::Device) {
            return Err(Error::invalid(format!(
                "{}: the peer's buffer is {} memory but this rank's is {}: both sides of a \
                 channel must use the same memory kind",
                ctx(),
                if is_device { "device" } else { "host" },
                it.ch.kind.name()
            )));
        }
        let t = self.channel_transport(it.ch.kind);
        let clock = logging::clock(logging::EXCHANGE, Level::Info);
        let mapping = t.import(&rec, wait).map_err(|e| e.context(ctx()))?;
        let mapping = Held::new(mapping, &self.counters);
        if clock.is_some() {
            log::info!(
                target: logging::EXCHANGE,
                "rank {}: opened peer rank {}'s {} buffer for {} (version {}, {} bytes) in {}",
                self.rank,
                it.ch.peer,
                it.ch.kind.name(),
                it.ch.key,
                rec.version,
                rec.bytes,
                since(clock)
            );
        }
        Ok(Imported {
            mapping,
            bytes: rec.bytes,
            sem_handle: ExportedHandle::plain(rec.sem_type, rec.sem_payload),
            sem_slot: rec.sem_slot,
            semaphore: 0,
            record: rec,
        })
    }
}

#[cfg(test)]
mod tests;
