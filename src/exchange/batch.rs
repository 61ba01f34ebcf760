//! One `exchange_handles` call: a [`Batch`] of channels, claimed from the table at its start and
//! handed back at its end (commit, suspend or fail); the steps it runs in between are `protocol`'s
//! (numbered as in docs/PROTOCOL.md, section 5), its waits for peers `waits`'.
//!
//! A hit on both sides costs a few shared-memory loads, no store operation, no allocation and no
//! syscall. A call that times out because a peer is not there yet leaves its channels *suspended*
//! in that step: calling again with the same batch resumes it (so a zero timeout checks once). Any
//! other failure *fails* the batch: its channels refuse every later call (`InvalidState`).

use super::board::BufferAt;
use super::channel::{
    fingerprint_of, occurrence, Channel, ChannelInfo, ChannelKey, ChannelTable, PeerSide, Progress,
    Request, Resume,
};
use super::held::HeldMapping;
use super::phases::{Lap, Phase};
use super::session::{bump, Imported, Session};
use crate::error::{Error, Result};
use crate::logging::{self, since};
use crate::sync::lock;
use crate::transport::record::NO_SLOT;
use crate::transport::{LocalBuffer, MemKind, PeerMapping};
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
        let mut released: Vec<(MemKind, HeldMapping)> = Vec::new();
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
fn forget_released(cx: &Session, st: &ChannelTable, released: &[(MemKind, HeldMapping)]) {
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

#[cfg(test)]
mod tests;
