//! One `exchange_handles` call as a batch: [`Batch::begin`] claims its channels (step 1), moving
//! each channel's progress out of the table into the batch's items; [`Batch::exchange`] runs the
//! protocol on them (`protocol`) and ends the batch in one of three ways, each moving the
//! progress back: commit (the new peer mappings are installed), suspend (a peer was not there in
//! time: the step stays open for the same batch to resume), or fail (the channels are poisoned).

use super::channel::{Channel, ChannelInfo, ChannelTable, Imported, PeerSide, Resume};
use super::context::Context;
use super::deadline::Deadline;
use super::events;
use super::phases::{Lap, Phase};
use super::protocol::{self, Item, RunError};
use super::request::{fingerprint_of, occurrence, ChannelKey, Request};
use super::stats::bump;
use crate::error::{Error, Result};
use crate::logging;
use crate::sync::lock;
use crate::transport::{LocalBuffer, Mapping, MemKind};
use std::sync::Mutex;
use std::time::Instant;

/// The channels of one call, claimed from the table until the batch ends. Its items live in a
/// vector the caller lends (reused per thread, so a warm call allocates nothing); ending the
/// batch leaves it empty.
pub(super) struct Batch<'a> {
    cx: &'a Context,
    table: &'a Mutex<ChannelTable>,
    items: &'a mut Vec<Item>,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.items.clear();
    }
}

/// How an exchange resolves its buffers to the allocations it exports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Resolution {
    /// The allocation the transport shares for buffers carved nearby (a widened VMM run), so
    /// that a peer maps it once for all of them: point-to-point exchanges.
    Shared,
    /// The buffer's own allocation: symmetric rendezvous, whose views map what records name.
    Exact,
}

/// Checks every request and resolves its buffer into `out`; nothing is changed on failure.
pub(super) fn resolve_all(
    cx: &Context,
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

fn resolve(cx: &Context, r: &Request, resolution: Resolution) -> Result<LocalBuffer> {
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
    /// Step 1: claims the channels of `requests` (whose buffers `resolved` holds, in order) and
    /// advances their step (and version), or resumes the step a timed-out call left. Nothing is
    /// claimed on failure. `indices` is scratch space.
    pub(super) fn begin(
        cx: &'a Context,
        table: &'a Mutex<ChannelTable>,
        requests: &[Request],
        resolved: &[LocalBuffer],
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
                    let key = ChannelKey::of(rank, r, occ);
                    let i = create_channel(cx, &mut st, r, key, fp)?;
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
            if ch.progress.is_none() {
                return Err(Error::state(format!(
                    "rank {rank}: {} is being exchanged by another thread; calls on the same \
                     channel must not overlap",
                    ch.info.key
                )));
            }
            if ch.info.kind != r.kind {
                return Err(Error::invalid(format!(
                    "rank {rank}: {} was used with {} memory and now with {}: a channel keeps its \
                     memory kind (use another tag)",
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
            let progress = ch.progress.as_ref().expect("checked in pass 1");
            if progress.resume.is_some() && !ch.holds(local) {
                return Err(Error::invalid(format!(
                    "rank {rank}: {} timed out waiting for its peer at step {} and must be \
                     resumed with the same buffer; call again with the buffer of that call",
                    ch.info.key, progress.step
                )));
            }
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
            let (publish, sent, known_to_peer, staged) = match progress.resume.take() {
                Some(r) => {
                    let Resume {
                        publish,
                        sent,
                        known_to_peer,
                        staged,
                    } = *r;
                    (publish, sent, known_to_peer, staged)
                }
                None => {
                    if changed {
                        progress.version += 1;
                    }
                    progress.step += 1;
                    (progress.version != progress.published, false, false, None)
                }
            };
            items.push(Item {
                channel: idx,
                ch: ch.info.clone(),
                local,
                progress,
                publish,
                peer_version: 0,
                peer_at: Default::default(),
                waiting: false,
                sent,
                known_to_peer,
                staged,
            });
        }
        Ok(Batch { cx, table, items })
    }

    /// Steps 2-5: runs the protocol on the batch's channels and ends the batch.
    pub(super) fn exchange(self, deadline: &mut Deadline, mut lap: Option<Lap<'_>>) -> Result<()> {
        // A cached call is logged at TRACE, one that moved records (or failed) at INFO.
        let clock = events::clock(log::Level::Info);
        match protocol::run(self.cx, &mut self.items[..], deadline, &mut lap) {
            Ok(imports) => {
                let done = self.commit(imports, clock, deadline);
                if let Some(mut lap) = lap {
                    lap.mark(Phase::Commit);
                    if done.is_ok() {
                        lap.finish();
                    }
                }
                done
            }
            Err(RunError::NotReady(err, imports)) => {
                self.suspend(imports, clock, &err);
                Err(err)
            }
            Err(RunError::Fatal(err)) => {
                self.fail(clock, &err);
                Err(err)
            }
        }
    }

    /// Step 5: installs the new peer mappings, releasing the ones they replace (a release never
    /// waits for device work; up to a bound of them are kept mapped for reuse instead, see
    /// `retain`), and gives every channel its progress back.
    fn commit(
        self,
        imports: Vec<Option<Imported>>,
        clock: Option<Instant>,
        deadline: &mut Deadline,
    ) -> Result<()> {
        let cx = self.cx;
        let opened = imports.iter().filter(|i| i.is_some()).count();
        let published = self.items.iter().filter(|it| it.publish).count();
        let first = match (clock, self.items.first()) {
            (Some(_), Some(it)) => Some((it.ch.clone(), it.progress.step, it.progress.version)),
            _ => None,
        };
        let mut hits = 0;
        let mut replaced = 0;
        let mut released: Vec<(MemKind, Mapping)> = Vec::new();
        {
            let mut st = lock(self.table);
            // `imports` is empty when nothing was imported.
            let mut imports = imports.into_iter();
            for it in self.items.iter_mut() {
                let imp = imports.next().flatten();
                let fetched = imp.is_some();
                let ch = &mut st.channels[it.channel];
                if let Some(imp) = imp {
                    // Before the replaced mapping is released below.
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
                        let limit = cx.settings.retained_per_peer();
                        for m in held.retained.retire(it.ch.kind, old.mapping, limit) {
                            cx.release_mapping(it.ch.kind, &m);
                            replaced += 1;
                            released.push((it.ch.kind, m));
                        }
                    }
                }
                if it.publish {
                    it.progress.published = it.progress.version;
                }
                ch.progress = Some(std::mem::take(&mut it.progress));
                if !it.publish && !fetched {
                    hits += 1;
                }
            }
            if !released.is_empty() {
                forget_released(cx, &st, &released);
            }
        }
        bump(&cx.counters.hits, hits);
        let misses = self.items.len() as u64 - hits;
        if misses > 0 {
            bump(&cx.counters.misses, misses);
        }
        bump(&cx.counters.exchanges, 1);
        if clock.is_some() {
            let level = if published + opened + replaced == 0 {
                log::Level::Trace
            } else {
                log::Level::Info
            };
            log::log!(
                target: logging::EXCHANGE,
                level,
                "rank {}: exchange of {} channel(s) done in {}: {published} published, \
                 {opened} opened, {replaced} released{}",
                cx.rank,
                self.items.len(),
                events::since(clock),
                match first {
                    Some((ch, step, version)) =>
                        format!(" (first: {} step {step} version {version})", ch.key),
                    None => String::new(),
                }
            );
        }
        self.wait_release_room(replaced, deadline)
    }

    /// Back-pressure on released mappings: the device transport closes them on a releaser thread
    /// once the device work queued before their release has finished; when more than its bound
    /// of one peer's mappings wait, this waits for the releaser, bounded by the call's timeout.
    /// A timeout fails the call without poisoning its channels: the new handles are installed
    /// and the replaced mappings stay queued.
    fn wait_release_room(&self, replaced: usize, deadline: &mut Deadline) -> Result<()> {
        if replaced == 0 {
            return Ok(());
        }
        let items = &self.items[..];
        for (i, it) in items.iter().enumerate() {
            // One wait per (kind, peer) of the batch.
            if items[..i]
                .iter()
                .any(|o| o.ch.peer == it.ch.peer && o.ch.kind == it.ch.kind)
            {
                continue;
            }
            let Some(t) = self.cx.transport(it.ch.kind) else {
                continue;
            };
            t.wait_release_room(it.ch.peer, deadline.remaining())
                .map_err(|e| {
                    e.context(format!(
                        "rank {}: {} (exchange timeout {:?}; its handles are current, the \
                         replaced mappings stay queued)",
                        self.cx.rank,
                        it.ch.key,
                        deadline.timeout()
                    ))
                })?;
        }
        Ok(())
    }

    /// A call that timed out waiting for a peer: its channels keep their step, version and
    /// what was opened, for the next call with the same batch to resume.
    fn suspend(self, imports: Vec<Option<Imported>>, clock: Option<Instant>, err: &Error) {
        {
            let mut st = lock(self.table);
            let mut imports = imports.into_iter();
            for it in self.items.iter_mut() {
                let mut progress = std::mem::take(&mut it.progress);
                progress.resume = Some(Box::new(Resume {
                    publish: it.publish,
                    sent: it.sent,
                    known_to_peer: it.known_to_peer,
                    staged: imports.next().flatten(),
                }));
                st.channels[it.channel].progress = Some(progress);
            }
        }
        log::info!(
            target: logging::EXCHANGE,
            "rank {}: exchange of {} channel(s) suspended after {}, resumable with the same \
             batch: {}",
            self.cx.rank,
            self.items.len(),
            events::since(clock),
            err.message
        );
    }

    /// Any other failure: the channels' state is unknown from here on, so they refuse every
    /// later call (their progress is dropped).
    fn fail(self, clock: Option<Instant>, err: &Error) {
        {
            let mut st = lock(self.table);
            for it in self.items.iter() {
                st.channels[it.channel].validity.fail();
                st.channels[it.channel].failed = Some(err.clone());
            }
        }
        log::info!(
            target: logging::EXCHANGE,
            "rank {}: exchange of {} channel(s) failed after {}, its channels are unusable: {}",
            self.cx.rank,
            self.items.len(),
            events::since(clock),
            err.message
        );
    }
}

/// Takes the allocations whose last mapping here was just released off the board lists of the
/// channels of their peer (see `held`): the peer sends records of them through the store again.
fn forget_released(cx: &Context, st: &ChannelTable, released: &[(MemKind, Mapping)]) {
    let held = lock(&cx.holdings);
    for (kind, m) in released {
        let same = |o: &Mapping| o.peer == m.peer && o.buffer_id == m.buffer_id;
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
            .filter(|c| c.info.peer == m.peer && c.info.kind == *kind)
        {
            cx.board.forget_known(c.info.entry, m.buffer_id);
        }
    }
}

fn create_channel(
    cx: &Context,
    st: &mut ChannelTable,
    r: &Request,
    key: ChannelKey,
    fp: u128,
) -> Result<usize> {
    let t = cx.transport(r.kind).expect("checked by resolve");
    let entry = cx.board.insert(fp)?;
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
