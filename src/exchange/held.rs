//! The records of a peer's allocations that one channel's importer holds, so that the peer can
//! send a buffer carved from one of them through the board alone, with no record in the store.
//!
//! The importer lists the allocation ids on its board entry of the channel (see `board`), and
//! the exporter reads the list before deciding whether to send a record. What makes the list
//! exact: it changes only (a) when the importer imports a new version on the channel, before it
//! publishes `opened` for that version, which the exporter waits for before it starts another
//! step, and (b) when the importer releases an allocation's mapping, which only shortens the
//! list. The records themselves are dropped only in (a), after the import of the step, and only
//! those no longer listed: so every allocation the exporter can have read on the list still has
//! its record here when the step that relies on it comes. A new cache starts with empty lists on
//! both sides (new boards, new channels).

use super::board::KNOWN_PER_CHANNEL;
use super::known::record_at;
use crate::transport::record::Record;

/// The channel's held records, most recently imported first.
#[derive(Default)]
pub(super) struct HeldRecords {
    records: Vec<Record>,
}

impl HeldRecords {
    /// The record of version `version` of the peer's buffer at `[offset, offset + bytes)` of
    /// allocation `alloc_id`, with the semaphore of the channel's last record `channel`.
    pub fn record_for(
        &self,
        alloc_id: u64,
        offset: u64,
        bytes: u64,
        version: u64,
        channel: &Record,
    ) -> Option<Record> {
        let known = self.records.iter().find(|r| r.buffer_id == alloc_id)?;
        record_at(known, offset, bytes, version, channel)
    }

    /// After the import of `rec` on the channel: keeps the records whose allocation the board
    /// still lists (`listed`: releases may have taken some off), puts `rec`'s allocation first
    /// and bounds the list. Returns the allocation ids to list on the board now.
    pub fn imported(&mut self, listed: &[u64], rec: &Record) -> Vec<u64> {
        let held = self
            .records
            .iter()
            .position(|r| r.buffer_id == rec.buffer_id);
        match held {
            // The pool pattern: an allocation held already moves first, with no clone unless
            // its pieces differ (VMM runs mapped for another range).
            Some(i) => {
                self.records[..=i].rotate_right(1);
                if self.records[0].segments != rec.segments {
                    self.records[0] = rec.clone();
                }
            }
            None => self.records.insert(0, rec.clone()),
        }
        // Keeps this import and the others still listed (the rest were released).
        let mut first = true;
        self.records
            .retain(|r| std::mem::take(&mut first) || listed.contains(&r.buffer_id));
        self.records.truncate(KNOWN_PER_CHANNEL);
        self.records.iter().map(|r| r.buffer_id).collect()
    }
}

#[cfg(test)]
mod tests;
