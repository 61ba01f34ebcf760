//! The exchange protocol of one call, steps 2 to 4, run on a batch's items over the cache's
//! context (step 1 and the commit are the batch's, see `batch`).
//!
//! Per channel (see [`request`](super::request)) every rank keeps a buffer *version* (bumped when
//! the resolved identity of its buffer changes) and a *step* (how many `exchange_handles` calls
//! included the channel). One call:
//!
//! 1. resolves every request to its allocation and bumps step (and version, on change);
//! 2. when its version changed since it last published, sends its new records with one
//!    `multi_set` (fire-and-forget; the key contains the version, so it can never overwrite an
//!    unread one), then publishes `(step, version)` on its node-local [board](super::board); a
//!    new buffer carved from an allocation whose record the peer holds for the channel (its
//!    board says so, see [`held`](super::held)) sends no record: the board's step carries where
//!    the buffer lies, and that it went without the store;
//! 3. waits, on the peers' boards, until each peer has reached the same step and reads the peer's
//!    version for that step: both ranks now agree on what changed, without a barrier;
//! 4. fetches, with one `multi_get`, the records of every peer whose version differs from the one
//!    it has opened (a step that went without the store: from the allocation's held record),
//!    imports them, publishes the versions it opened on the board, and waits until
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
//! most one `multi_set` and one `multi_get`, and none when the buffers lie in allocations the peers
//! hold records of. A wait spins, then blocks on the peer's board until the peer publishes (see
//! `os::wait::blocking_pace` for how long it spins). A call that times out because a peer is not there
//! yet (it has not reached the same step, or has not opened this rank's new buffer) leaves its
//! channels suspended in that step, so a zero timeout checks once: calling again with the same
//! batch (same buffers) resumes the step where it stopped, and the peer never notices. Any other
//! failure (a peer that closed or died, a bad record, a store error) poisons the channels of its
//! batch: later calls on them fail with `InvalidState` (create a new cache).

use super::board::BufferAt;
use super::channel::{ChannelInfo, Imported, Progress};
use super::context::{Context, PeerHoldings};
use super::deadline::Deadline;
use super::events::{self, PendingWait, Stage};
use super::phases::{self, Lap, Phase};
use super::stats::bump;
use crate::error::{Error, Result, Status};
use crate::logging;
use crate::os::wait::{blocking_pace, wait_blocking};
use crate::sync::lock;
use crate::transport::record::{self, flags, local_host, Record};
use crate::transport::{slot_address, ExportedHandle, LocalBuffer, MemKind};
use std::sync::Arc;
use std::time::Duration;

/// Work of one request in one call. What the channel is comes through one `Arc`; its progress
/// is moved out of the table and back; the rest is this call's own.
pub(super) struct Item {
    /// The channel's index in the table.
    pub channel: usize,
    pub ch: Arc<ChannelInfo>,
    /// This call's buffer.
    pub local: LocalBuffer,
    /// The channel's progress, this call's until the batch ends.
    pub progress: Progress,
    /// This call sends new records (the channel's version changed since it last published).
    pub publish: bool,
    pub peer_version: u64,
    /// Where the peer's buffer of `peer_version` lies (from its board).
    pub peer_at: BufferAt,
    /// Still waited for by the current wait (peer's step, then peer's open).
    pub waiting: bool,
    /// Resuming a suspended step: its records are already in the store.
    pub sent: bool,
    /// This step sends no record: the peer holds the record of the buffer's allocation.
    pub known_to_peer: bool,
    /// Resuming a suspended step: the peer's buffer, already opened then.
    pub staged: Option<Imported>,
}

/// Why a call's steps 2-4 failed: a peer not there in time (the step can be resumed), or
/// anything else (the channels are poisoned).
pub(super) enum RunError {
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

/// Polls of a board wait before the first liveness check of the peers (`kill(pid, 0)`, a
/// syscall), so a peer a few microseconds late costs none; once the wait blocks, every check
/// after a block makes one (a block lasts until the peer publishes, or `BLOCK_SLICE`).
const FIRST_LIVENESS_POLL: u32 = 2048;
/// Polls between two liveness checks while spinning past that.
const LIVENESS_EVERY: u32 = 256;

/// How long a wait sleeps between two looks for a peer board that does not exist yet.
const NO_BOARD_SLEEP: Duration = Duration::from_millis(1);

fn liveness_check_due(polls: u32) -> bool {
    polls >= FIRST_LIVENESS_POLL && polls % LIVENESS_EVERY == 0
}

/// Steps 2-4, without the channel table's lock. Returns the new peer mappings by item index.
pub(super) fn run(
    cx: &Context,
    items: &mut [Item],
    deadline: &mut Deadline,
    lap: &mut Option<Lap<'_>>,
) -> std::result::Result<Vec<Option<Imported>>, RunError> {
    Call { cx }.run(items, deadline, lap)
}

/// One call's protocol over the cache's context.
struct Call<'a> {
    cx: &'a Context,
}

impl Call<'_> {
    fn run(
        &self,
        items: &mut [Item],
        deadline: &mut Deadline,
        lap: &mut Option<Lap<'_>>,
    ) -> std::result::Result<Vec<Option<Imported>>, RunError> {
        // A channel that has not found its peer's board yet may have a peer that can never
        // have one here (another host or container): refuse it before anything is published.
        // A board found on this node's /dev/shm settles it (an IPC namespace it does not share
        // is still refused when its records are imported); so the lookup, one store round trip,
        // happens only for a peer whose board is not there yet.
        let mut unknown: Vec<usize> = Vec::new();
        for it in items
            .iter_mut()
            .filter(|it| it.progress.link.board.is_none())
        {
            if self.cx.peer_nodes.known(it.ch.peer) {
                continue;
            }
            match self.cx.peer_board(it.ch.peer) {
                Ok(Some(board)) => it.progress.link.board = Some(board),
                _ => unknown.push(it.ch.peer),
            }
        }
        if !unknown.is_empty() {
            bump(&self.cx.counters.peer_lookups, 1);
            self.cx
                .peer_nodes
                .check(
                    &*self.cx.store,
                    &self.cx.names,
                    self.cx.rank,
                    &unknown,
                    deadline.remaining(),
                )
                .map_err(|e| RunError::classify(e, Vec::new()))?;
        }
        phases::mark(lap, Phase::Lookup);
        // Records go out before the step is visible on the board: a peer that sees the step
        // knows the records are already on their way to the store, so its multi_get never waits
        // on this rank's progress (which matters when several threads share one store client).
        self.send_records(items, lap).map_err(RunError::Fatal)?;
        for it in items.iter_mut() {
            it.sent = true;
        }
        phases::mark(lap, Phase::Records);
        for it in items.iter() {
            let at = BufferAt {
                alloc_id: it.local.buffer_id,
                offset: it.local.offset(),
                bytes: it.local.bytes,
                known_to_peer: it.publish && it.known_to_peer,
            };
            self.cx
                .board
                .publish(it.ch.entry, it.progress.step, it.progress.version, at);
        }
        phases::mark(lap, Phase::Publish);
        if let Err(e) = self.wait_peers(items, deadline) {
            let staged = items.iter_mut().map(|it| it.staged.take()).collect();
            return Err(RunError::classify(e, staged));
        }
        phases::mark(lap, Phase::WaitPeers);
        let mut imports = match self.fetch_records(items, deadline, lap) {
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
                        self.cx.release_mapping(imp.kind, &imp.mapping);
                    }
                }
                return Err(RunError::Fatal(e));
            }
        };
        phases::mark(lap, Phase::Import);
        // Everything of the peer this rank needs is mapped before it says so: a peer that has
        // seen `opened` may return, and exit, and its memory is passed by its own process.
        if let Err(e) = self.map_peer_slabs(items, &mut imports, deadline) {
            self.cx.release_imports(imports);
            return Err(RunError::Fatal(e));
        }
        for (it, imp) in items.iter_mut().zip(&imports) {
            if let Some(imp) = imp {
                // The list changes before `opened` says the step is done (see `held`).
                let listed = self.cx.board.known(it.ch.entry);
                let ids = it.progress.held.imported(&listed, &imp.record);
                self.cx.board.set_known(it.ch.entry, &ids);
                self.cx.board.publish_opened(it.ch.entry, it.peer_version);
            }
        }
        phases::mark(lap, Phase::Slabs);
        if let Err(e) = self.wait_opened(items, deadline) {
            if e.status == Status::Timeout {
                return Err(RunError::NotReady(e, imports));
            }
            self.cx.release_imports(imports);
            return Err(RunError::Fatal(e));
        }
        phases::mark(lap, Phase::WaitOpened);
        Ok(imports)
    }

    fn send_records(&self, items: &mut [Item], lap: &mut Option<Lap<'_>>) -> Result<()> {
        let mut pairs: Vec<(String, Vec<u8>)> = Vec::new();
        for it in items.iter_mut().filter(|it| it.publish && !it.sent) {
            // Read before this step is published, so exact (see `held`).
            let knows = |it: &Item, id: u64| match (&it.progress.link.board, it.progress.link.entry)
            {
                (Some(b), Some(e)) => b.knows(e, id),
                _ => false,
            };
            it.known_to_peer = knows(it, it.local.buffer_id);
            if !it.known_to_peer {
                // Exported only as mapped now (a widened VMM run may have lost a neighbour
                // since it was remembered; see `cuda::vmm_runs`).
                let fresh = self
                    .cx
                    .channel_transport(it.ch.kind)
                    .refresh(&it.local)
                    .map_err(|e| {
                        e.context(format!(
                            "rank {}: resolving the buffer of {} again",
                            self.cx.rank, it.ch.key
                        ))
                    })?;
                if fresh != it.local {
                    it.local = fresh;
                    it.known_to_peer = knows(it, fresh.buffer_id);
                }
            }
            if it.known_to_peer {
                continue;
            }
            let rec = self.make_record(it).map_err(|e| {
                e.context(format!(
                    "rank {}: exporting the buffer of {}",
                    self.cx.rank, it.ch.key
                ))
            })?;
            pairs.push((self.own_record_key(it), rec.encode()));
        }
        phases::mark(lap, Phase::Export);
        if pairs.is_empty() {
            return Ok(());
        }
        let refs: Vec<(&str, &[u8])> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        bump(&self.cx.counters.store_round_trips, 1);
        let clock = events::clock(log::Level::Info);
        self.cx.store.multi_set(&refs).map_err(|e| {
            e.context(format!(
                "rank {}: publishing {} record(s) (first key {})",
                self.cx.rank,
                pairs.len(),
                pairs[0].0
            ))
        })?;
        bump(&self.cx.counters.records_sent, pairs.len() as u64);
        let bytes: usize = pairs.iter().map(|(_, v)| v.len()).sum();
        bump(&self.cx.counters.record_bytes_sent, bytes as u64);
        if clock.is_some() {
            let keys: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
            log::info!(
                target: logging::EXCHANGE,
                "rank {}: sent {} record(s) ({bytes} bytes) to the store in {}: {}",
                self.cx.rank,
                pairs.len(),
                events::since(clock),
                events::some_keys(&keys, 4)
            );
        }
        Ok(())
    }

    /// The store key of this rank's record of `it` at its version.
    fn own_record_key(&self, it: &Item) -> String {
        it.ch
            .key
            .record_key(&self.cx.names, self.cx.rank, it.progress.version)
    }

    /// The store key of the peer's record of `it` at the peer's version.
    fn peer_record_key(&self, it: &Item) -> String {
        it.ch
            .key
            .record_key(&self.cx.names, it.ch.peer, it.peer_version)
    }

    fn make_record(&self, it: &Item) -> Result<Record> {
        let t = self.cx.channel_transport(it.ch.kind);
        let handle = t.export(&it.local)?;
        let slab = t.semaphores().export()?;
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
            rank: self.cx.rank as u32,
            host_name: record::to_fixed(&host.name).unwrap_or([0; record::HOST_NAME_LEN]),
            payload: handle.payload,
            sem_type: slab.handle_type,
            sem_slot: it.ch.slot,
            sem_payload: slab.payload,
            segments: handle.segments,
        })
    }

    /// Maps the semaphore slabs of the peers whose buffers `imports` holds (those not mapped
    /// yet) and gives each import its peer semaphore's address here.
    fn map_peer_slabs(
        &self,
        items: &[Item],
        imports: &mut [Option<Imported>],
        deadline: &mut Deadline,
    ) -> Result<()> {
        let mut held = lock(&self.cx.holdings);
        for (it, imp) in items.iter().zip(imports.iter_mut()) {
            if let Some(imp) = imp {
                let base = self
                    .peer_slab(&mut held, it, &imp.sem_handle, deadline)
                    .map_err(|e| {
                        e.context(format!(
                            "rank {}: mapping peer rank {}'s semaphore slab for {}",
                            self.cx.rank, it.ch.peer, it.ch.key
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
        held: &mut PeerHoldings,
        it: &Item,
        handle: &ExportedHandle,
        deadline: &mut Deadline,
    ) -> Result<u64> {
        let key = (it.ch.peer, it.ch.kind);
        if let Some((h, base)) = held.slabs.get(&key) {
            if h == handle {
                return Ok(*base);
            }
        }
        let slab = self.cx.channel_transport(it.ch.kind).semaphores();
        let base = slab.import_peer(it.ch.peer, handle, deadline.remaining())?;
        bump(&self.cx.counters.opens, 1);
        // A peer that recreated its slab: drop our reference to the old one.
        if let Some((old, _)) = held.slabs.insert(key, (handle.clone(), base)) {
            let _ = slab.release_peer(it.ch.peer, &old);
            bump(&self.cx.counters.closes, 1);
        }
        Ok(base)
    }

    /// Waits, within `deadline`, until `ready` holds for every item marked `waiting`, clearing
    /// the mark of each that gets ready. Now and then (about every 100 ms once sleeping) it makes
    /// sure the awaited peers still exist and have not closed their caches, so a crashed or
    /// closed peer is reported at once rather than at the timeout. Returns whether every item got
    /// ready; `false` when the deadline ran out (the items still marked are the late ones).
    fn wait_items(
        &self,
        items: &mut [Item],
        stage: Stage,
        deadline: &mut Deadline,
        mut ready: impl FnMut(&Self, &mut Item) -> Result<bool>,
    ) -> Result<bool> {
        let mut left = items.iter().filter(|it| it.waiting).count();
        if left == 0 {
            return Ok(true);
        }
        let mut error: Option<Error> = None;
        let mut polls: u32 = 0;
        let mut stuck = events::StuckReport::new();
        let timeout = deadline.timeout();
        let mut poll = |after_block: bool, items: &mut [Item]| {
            polls = polls.wrapping_add(1);
            // Checked before the entries: what a peer published before it closed or exited is
            // visible once its `closed` flag or its death is, and then it is no failure.
            let due = after_block || liveness_check_due(polls);
            let gone = if due {
                stuck.check(
                    self.cx.rank,
                    items.iter().filter(|it| it.waiting).map(|it| PendingWait {
                        peer: it.ch.peer,
                        key: &it.ch.key,
                        step: it.progress.step,
                        version: it.progress.version,
                    }),
                    stage,
                    timeout,
                );
                self.gone_peer(items, stage)
            } else {
                None
            };
            for it in items.iter_mut().filter(|it| it.waiting) {
                match ready(self, it) {
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
        let done = match poll(false, items) {
            Some(()) => Some(()),
            None => {
                let pace = blocking_pace(lock(&self.cx.peer_boards).len() + 1);
                wait_blocking(pace, deadline.remaining(), |block| {
                    let Some(max) = block else {
                        return poll(false, items);
                    };
                    // Blocks on the board of the first peer still awaited, until it publishes;
                    // the others are checked when it wakes this rank.
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
                })
            }
        };
        if let Some(e) = error {
            return Err(e);
        }
        // A wait that timed out may have seen the last item get ready in its final check.
        Ok(done.is_some() || items.iter().all(|it| !it.waiting))
    }

    /// Step 3: waits until every peer has reached this call's step on its channel, and reads
    /// the peer's version for that step.
    fn wait_peers(&self, items: &mut [Item], deadline: &mut Deadline) -> Result<()> {
        for it in items.iter_mut() {
            it.waiting = true;
        }
        let rank = self.cx.rank;
        let all_there = self.wait_items(items, Stage::Step, deadline, |call, it| {
            if it.progress.link.board.is_none() {
                it.progress.link.board = call
                    .cx
                    .peer_board(it.ch.peer)
                    .map_err(|e| e.context(format!("rank {rank}")))?;
            }
            let Some(board) = &it.progress.link.board else {
                return Ok(false);
            };
            if it.progress.link.entry.is_none() {
                it.progress.link.entry = board.find(it.ch.fp);
            }
            let Some(entry) = it.progress.link.entry else {
                return Ok(false);
            };
            match board.read(entry, it.progress.step) {
                Some((version, at)) => {
                    it.peer_version = version;
                    it.peer_at = at;
                    Ok(true)
                }
                None => Ok(false),
            }
        })?;
        if all_there {
            return Ok(());
        }
        let pending = items.iter().filter(|it| it.waiting).count();
        let it = items
            .iter()
            .find(|it| it.waiting)
            .expect("a wait that timed out left an item pending");
        let name = self.cx.names.board(it.ch.peer);
        let seen = match (self.cx.peer_board(it.ch.peer), it.progress.link.entry) {
            (Ok(Some(b)), Some(e)) => format!("its entry is at step {}", b.step(e)),
            (Ok(Some(_)), None) => "it has not used this channel yet".to_string(),
            _ => "its board does not exist yet (has it created its cache?)".to_string(),
        };
        Err(Error::timeout(format!(
            "rank {} timed out after {:?} waiting for peer rank {} on {} at step {}: board \
             entry {} of {} not at step {} ({seen}); {} other channel(s) also pending. Does \
             rank {} call exchange_handles with the matching request?",
            self.cx.rank,
            deadline.timeout(),
            it.ch.peer,
            it.ch.key,
            it.progress.step,
            it.ch.key.describe(),
            name,
            it.progress.step,
            pending - 1,
            it.ch.peer,
        )))
    }

    /// Step 4b: for every channel where this rank published a new buffer, waits until the peer
    /// has opened it. So when a call returns, both sides hold handles to each other's current
    /// buffers, and the exporter may free an old buffer without racing the peer's open.
    fn wait_opened(&self, items: &mut [Item], deadline: &mut Deadline) -> Result<()> {
        for it in items.iter_mut() {
            it.waiting = it.publish;
        }
        let all_opened = self.wait_items(items, Stage::Open, deadline, |_, it| {
            Ok(match (&it.progress.link.board, it.progress.link.entry) {
                (Some(b), Some(e)) => b.opened(e) >= it.progress.version,
                _ => false,
            })
        })?;
        if all_opened {
            return Ok(());
        }
        let it = items
            .iter()
            .find(|it| it.waiting)
            .expect("a wait that timed out left an item pending");
        let opened = match (&it.progress.link.board, it.progress.link.entry) {
            (Some(b), Some(e)) => b.opened(e),
            _ => 0,
        };
        Err(Error::timeout(format!(
            "rank {} timed out after {:?} waiting for peer rank {} to open version {} of this \
             rank's buffer on {} at step {} (board entry {} of {} shows version {opened} \
             opened; key {:?}); did the peer fail in exchange_handles?",
            self.cx.rank,
            deadline.timeout(),
            it.ch.peer,
            it.progress.version,
            it.ch.key,
            it.progress.step,
            it.ch.key.describe(),
            self.cx.names.board(it.ch.peer),
            self.own_record_key(it),
        )))
    }

    /// Fails when this rank's board, or the board of a peer still awaited, was truncated or
    /// shrunk by another process: it reads zeros from then on (see `board`), so a wait on it
    /// would otherwise last until the timeout, or its peers' would. At every poll, what this
    /// rank's accesses ran into (one atomic load per board); with `probe`, at the pace of the
    /// liveness checks, a shrink that no access ran into yet.
    fn boards_intact(&self, items: &[Item], probe: bool) -> Result<()> {
        self.cx
            .board
            .check(probe)
            .and_then(|()| {
                items
                    .iter()
                    .filter(|it| it.waiting)
                    .filter_map(|it| it.progress.link.board.as_deref())
                    .try_for_each(|b| b.check(probe))
            })
            .map_err(|e| e.context(format!("rank {}", self.cx.rank)))
    }

    /// The first pending item whose peer has closed its cache or exited, with an error naming
    /// the peer and what this rank was waiting for.
    fn gone_peer(&self, items: &[Item], stage: Stage) -> Option<(usize, Error)> {
        items.iter().enumerate().find_map(|(i, it)| {
            if !it.waiting {
                return None;
            }
            let waited_for = || match stage {
                Stage::Step => format!("reaching step {} on {}", it.progress.step, it.ch.key),
                Stage::Open => format!(
                    "opening version {} of this rank's buffer on {} at step {}",
                    it.progress.version, it.ch.key, it.progress.step
                ),
            };
            let who = it.ch.peer;
            let Some(board) = it.progress.link.board.as_ref() else {
                // Its board was never seen here (it may have died before this rank looked, and
                // its board gone with it): its process, as its cache published it.
                let pid = self.cx.peer_nodes.exited(who)?;
                return Some((
                    i,
                    Error::io(format!(
                        "rank {}: peer rank {who} (pid {pid}) exited before {}; its cache had \
                         been created, its board is gone",
                        self.cx.rank,
                        waited_for()
                    )),
                ));
            };
            let closed = board.closed();
            if !closed && board.owner_alive() {
                return None;
            }
            let waited_for = waited_for();
            let pid = board.owner_pid();
            let err = if closed {
                Error::state(format!(
                    "rank {}: peer rank {who} (pid {pid}) closed its cache before {waited_for}; \
                     a closed cache takes no part in exchanges (create new caches on both ranks)",
                    self.cx.rank
                ))
            } else {
                Error::io(format!(
                    "rank {}: peer rank {who} (pid {pid}) exited before {waited_for}",
                    self.cx.rank
                ))
            };
            Some((i, err))
        })
    }

    /// Refuses to import a record of a peer that has closed its cache: it may free that memory
    /// as soon as the ranks it waits for have closed.
    fn refuse_closed_peer(&self, it: &Item, key: &str) -> Result<()> {
        match &it.progress.link.board {
            Some(b) if b.closed() => Err(Error::state(format!(
                "rank {}: peer rank {} (pid {}) closed its cache before this rank opened its \
                 record {key:?} for {}; a closed cache takes no part in exchanges (create new \
                 caches on both ranks)",
                self.cx.rank,
                it.ch.peer,
                b.owner_pid(),
                it.ch.key
            ))),
            _ => Ok(()),
        }
    }

    /// Step 4: fetches and imports the records of peers whose version changed.
    /// Returns the imports by item index; empty (nothing imported) when every peer is cached.
    fn fetch_records(
        &self,
        items: &mut [Item],
        deadline: &mut Deadline,
        lap: &mut Option<Lap<'_>>,
    ) -> Result<Vec<Option<Imported>>> {
        if items
            .iter()
            .all(|it| it.peer_version == it.progress.peer_opened && it.staged.is_none())
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
            .filter(|&i| {
                items[i].peer_version != items[i].progress.peer_opened && imports[i].is_none()
            })
            .collect();
        if wanted.is_empty() {
            return Ok(imports);
        }
        let wanted = match self.import_known(items, &wanted, &mut imports, deadline) {
            Ok(rest) => rest,
            Err(e) => {
                self.cx.release_imports(imports);
                return Err(e);
            }
        };
        phases::mark(lap, Phase::ImportKnown);
        if wanted.is_empty() {
            return Ok(imports);
        }
        let keys: Vec<String> = wanted
            .iter()
            .map(|&i| self.peer_record_key(&items[i]))
            .collect();
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        bump(&self.cx.counters.store_round_trips, 1);
        let remaining = deadline.remaining();
        let clock = events::clock(log::Level::Info);
        let fetched = self.cx.store.multi_get(&key_refs, remaining);
        phases::mark(lap, Phase::Fetch);
        if clock.is_some() {
            log::info!(
                target: logging::EXCHANGE,
                "rank {}: fetching {} record(s) from the store took {} ({}): {}",
                self.cx.rank,
                keys.len(),
                events::since(clock),
                match &fetched {
                    Ok(_) => "found",
                    Err(e) if e.status == Status::Timeout => "not there yet",
                    Err(_) => "failed",
                },
                events::some_keys(&keys, 4)
            );
        }
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
                    self.cx.rank,
                    keys.len(),
                    deadline.timeout(),
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
                self.cx.rank,
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
                    self.cx.release_imports(imports);
                    return Err(e);
                }
            }
        }
        bump(&self.cx.counters.records_received, wanted.len() as u64);
        Ok(imports)
    }

    fn collector_delete(&self, keys: Vec<String>) {
        lock(&self.cx.collector).delete(keys);
    }

    /// Imports, without the store, the wanted items whose peer buffer lies inside an allocation
    /// whose record this rank already holds (see `known`); their records, which the peer sent
    /// all the same, are deleted by the collector once they arrive. Returns the items left to
    /// fetch from the store.
    fn import_known(
        &self,
        items: &[Item],
        wanted: &[usize],
        imports: &mut [Option<Imported>],
        deadline: &mut Deadline,
    ) -> Result<Vec<usize>> {
        // (record, whether it is the channel's own kept record).
        let records: Vec<Option<(Record, bool)>> = {
            let held = lock(&self.cx.holdings);
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
                    let pid = it.progress.link.board.as_ref()?.owner_pid();
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
            let key = self.peer_record_key(it);
            let Some((rec, kept)) = rec else {
                if it.peer_at.known_to_peer {
                    return Err(self.not_held(it, &key));
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
        bump(&self.cx.counters.records_known, board_only);
        if !keys.is_empty() {
            bump(&self.cx.counters.records_known, keys.len() as u64);
            lock(&self.cx.collector).delete_when_written(keys);
        }
        Ok(rest)
    }

    /// The error of a step the peer sent through the board alone, for an allocation whose record
    /// this rank does not hold for the channel: the two sides disagree on what it holds.
    fn not_held(&self, it: &Item, key: &str) -> Error {
        Error::protocol(format!(
            "rank {}: peer rank {} published version {} of its buffer on {} (allocation {}, \
             offset {}, {} bytes) without a record, as one this rank holds, but this rank holds \
             no record of that allocation for the channel (no key {key:?} in the store either); \
             all ranks must use the same nvfuser-ipc version: create new caches on both ranks",
            self.cx.rank,
            it.ch.peer,
            it.peer_version,
            it.ch.key,
            it.peer_at.alloc_id,
            it.peer_at.offset,
            it.peer_at.bytes,
        ))
    }

    fn import(&self, it: &Item, value: &[u8], key: &str, wait: Duration) -> Result<Imported> {
        let ctx = || {
            format!(
                "rank {}: record {key:?} of peer rank {} for {}",
                self.cx.rank, it.ch.peer, it.ch.key
            )
        };
        let rec = Record::decode(value).map_err(|e| e.context(ctx()))?;
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
        let ctx = || {
            format!(
                "rank {}: record {key:?} of peer rank {} for {}",
                self.cx.rank, it.ch.peer, it.ch.key
            )
        };
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
        let t = self.cx.channel_transport(it.ch.kind);
        let clock = events::clock(log::Level::Info);
        let mapping = t.import(&rec, wait).map_err(|e| e.context(ctx()))?;
        bump(&self.cx.counters.opens, 1);
        if clock.is_some() {
            log::info!(
                target: logging::EXCHANGE,
                "rank {}: opened peer rank {}'s {} buffer for {} (version {}, {} bytes) in {}",
                self.cx.rank,
                it.ch.peer,
                it.ch.kind.name(),
                it.ch.key,
                rec.version,
                rec.bytes,
                events::since(clock)
            );
        }
        Ok(Imported {
            kind: it.ch.kind,
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
