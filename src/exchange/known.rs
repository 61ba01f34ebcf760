//! Records of peer allocations this rank has seen, so a buffer that moves inside one of them
//! needs no store fetch.
//!
//! nvFuser's buffers come from PyTorch's caching allocator: every iteration's tensors are carved
//! at new offsets from a few large segments. A record describes a whole allocation (its handle)
//! plus where the buffer lies in it. Each rank publishes on its board, with every buffer version,
//! where that buffer lies (allocation id, offset, bytes). A peer that already holds a record of
//! that allocation of that process builds the new version's record from it and imports at once
//! (the transport deduplicates the mapping), instead of waiting for the record to come back from
//! the store. The exporter still sends the record (it cannot know what the peer holds); the
//! importer then hands its key to the collector, which deletes it once it has arrived.
//!
//! Allocation ids are never reused within a process (CUDA's `BUFFER_ID`, the host allocator's
//! ids), and records are keyed by the exporter's pid too, so a kept record can never describe
//! another allocation. The table is bounded: past [`MAX_KNOWN`] it starts over, which costs only
//! store fetches.

use crate::transport::record::Record;
use crate::transport::MemKind;
use std::collections::HashMap;

/// Allocation records kept per cache before the table starts over.
pub const MAX_KNOWN: usize = 4096;

/// (peer rank, exporter pid, memory kind, allocation id).
type Key = (usize, u32, MemKind, u64);

/// Peer allocation records by allocation.
#[derive(Default)]
pub struct KnownAllocations {
    records: HashMap<Key, Record>,
}

impl KnownAllocations {
    /// Remembers the allocation that `rec` (imported from `peer`) describes.
    pub fn learn(&mut self, peer: usize, kind: MemKind, rec: &Record) {
        if self.records.len() >= MAX_KNOWN {
            self.records.clear();
        }
        self.records
            .insert((peer, rec.pid, kind, rec.buffer_id), rec.clone());
    }

    /// The record of version `version` of a buffer of `peer` (process `pid`) lying at
    /// `[offset, offset + bytes)` of allocation `alloc_id`, built from the allocation's kept
    /// record, with the semaphore of the channel's own last record `channel`. `None` when the
    /// allocation is not known or the place does not fit in it.
    pub fn record_for(
        &self,
        key: Key,
        offset: u64,
        bytes: u64,
        version: u64,
        channel: &Record,
    ) -> Option<Record> {
        record_at(self.records.get(&key)?, offset, bytes, version, channel)
    }
}

/// The record of version `version` of a buffer at `[offset, offset + bytes)` of the allocation
/// that `known` describes, with the semaphore of the channel's own last record `channel`. `None`
/// when the place does not fit in the allocation or `channel` is of another process or rank.
pub(super) fn record_at(
    known: &Record,
    offset: u64,
    bytes: u64,
    version: u64,
    channel: &Record,
) -> Option<Record> {
    let fits = bytes > 0
        && offset
            .checked_add(bytes)
            .is_some_and(|e| e <= known.alloc_bytes);
    if !fits || channel.pid != known.pid || channel.rank != known.rank {
        return None;
    }
    Some(Record {
        offset,
        bytes,
        version,
        sem_type: channel.sem_type,
        sem_slot: channel.sem_slot,
        sem_payload: channel.sem_payload,
        ..known.clone()
    })
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::transport::record::{local_host, HandleType};

    pub(in crate::exchange) fn rec(buffer_id: u64, slot: u32) -> Record {
        Record {
            handle_type: HandleType::PosixFd,
            flags: 0,
            offset: 0,
            bytes: 64,
            alloc_bytes: 4096,
            buffer_id,
            host_id: local_host().id,
            version: 1,
            device_uuid: [0; 16],
            pid: 42,
            rank: 1,
            host_name: [0; 32],
            payload: [buffer_id as u8; 64],
            sem_type: HandleType::PosixFd,
            sem_slot: slot,
            sem_payload: [9; 64],
            segments: Vec::new(),
        }
    }

    #[test]
    fn a_known_allocation_gives_records_for_new_places() {
        let mut k = KnownAllocations::default();
        k.learn(1, MemKind::Host, &rec(5, 3));
        let channel = rec(6, 7);
        let got = k
            .record_for((1, 42, MemKind::Host, 5), 1024, 512, 9, &channel)
            .unwrap();
        assert_eq!(got.payload, [5; 64], "the allocation's handle");
        assert_eq!(got.sem_slot, 7, "the channel's semaphore");
        assert_eq!((got.offset, got.bytes, got.version), (1024, 512, 9));
        // Unknown allocation, kind, pid, or a place outside the allocation: no record.
        assert!(k
            .record_for((1, 42, MemKind::Host, 6), 0, 8, 9, &channel)
            .is_none());
        assert!(k
            .record_for((1, 42, MemKind::Device, 5), 0, 8, 9, &channel)
            .is_none());
        assert!(k
            .record_for((1, 43, MemKind::Host, 5), 0, 8, 9, &channel)
            .is_none());
        assert!(k
            .record_for((1, 42, MemKind::Host, 5), 4000, 97, 9, &channel)
            .is_none());
        assert!(k
            .record_for((1, 42, MemKind::Host, 5), 0, 0, 9, &channel)
            .is_none());
    }

    #[test]
    fn the_table_is_bounded() {
        let mut k = KnownAllocations::default();
        for id in 0..MAX_KNOWN as u64 + 1 {
            k.learn(0, MemKind::Host, &rec(id, 0));
        }
        assert!(k.records.len() <= MAX_KNOWN);
    }
}
