//! Steps 2-6 of one call (docs/PROTOCOL.md, section 5): send records, publish the step, import
//! the peers' records (fetched, or built from ones held) and slabs; the waits between are `waits`'.

use super::batch::{Deadline, Item, RunError};
use super::board::BufferAt;
use super::phases::{Lap, Phase};
use super::session::{bump, Imported, Session};
use super::waits::Stage;
use crate::error::{Error, Result, Status};
use crate::logging::{self, since};
use crate::sync::lock;
use crate::transport::record::{self, flags, local_host, Record, NO_SLOT};
use crate::transport::{slot_address, ExportedHandle, MemKind};
use log::Level;
use std::time::Duration;

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

/// A timeout leaves `imports` to the step that resumes; any other failure drops them.
fn give_up(e: Error, imports: Vec<Option<Imported>>) -> RunError {
    if e.status == Status::Timeout {
        return RunError::NotReady(e, imports);
    }
    RunError::Fatal(e)
}

/// Steps 2-6 of a call, over the cache's context.
impl Session {
    pub(super) fn run(
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
    pub(super) fn record_key(&self, it: &Item, own: bool) -> String {
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
                    let slab = self.counters.hold(slab);
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
        let mapping = self.counters.hold(mapping);
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
