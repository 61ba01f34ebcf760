//! Buffers the device transport resolved before, each with what proves it unchanged, so that a
//! cached exchange asks the driver one short question per buffer (`memory::allocation_identity`
//! or, per VMM segment, `memory::segment_identity`) instead of the whole pointer query, the
//! segment walk and the widening.
//!
//! Sound because the proof is the driver's: a legacy or pool allocation keeps its range and its
//! process-unique `BUFFER_ID` for its lifetime, and a VMM segment its mapping and block id; memory
//! freed and allocated again at the same address answers with another id, and the buffer is
//! resolved afresh. Bounded: at most [`CAPACITY`] buffers, replaced in turn once all are taken,
//! and a warm lookup allocates nothing.

use super::vmm::LocalSegment;
use crate::sync::lock;
use crate::transport::LocalBuffer;
use std::sync::Mutex;

/// Buffers remembered per transport: more than the buffers of any one call we know of, few
/// enough that a lookup is a short scan.
pub const CAPACITY: usize = 64;

/// Which resolution a buffer was remembered for (a widened VMM run differs from the exact one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resolution {
    Exact,
    Shared,
}

/// What proves a remembered buffer unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proof {
    /// A legacy or pool allocation: its range and buffer id are the buffer's `base`,
    /// `alloc_bytes` and `buffer_id`.
    Allocation,
    /// VMM memory: the segments of the run the buffer was exported as, each still mapped where it
    /// was, as the same physical allocation.
    Segments(Vec<LocalSegment>),
}

struct Entry {
    ptr: u64,
    bytes: u64,
    resolution: Resolution,
    buffer: LocalBuffer,
    proof: Proof,
}

#[derive(Default)]
struct Slots {
    entries: Vec<Entry>,
    /// The entry replaced next once all slots are taken.
    next: usize,
}

/// The remembered buffers (see the module docs).
pub struct Resolved {
    slots: Mutex<Slots>,
}

impl Default for Resolved {
    fn default() -> Self {
        Resolved {
            slots: Mutex::new(Slots {
                // Reserved once, so that remembering never grows it on the exchange path.
                entries: Vec::with_capacity(CAPACITY),
                next: 0,
            }),
        }
    }
}

impl Resolved {
    /// The buffer remembered for `[ptr, ptr + bytes)` under `resolution`, when `unchanged` (the
    /// driver's word) still vouches for its proof; an entry it does not vouch for is forgotten.
    pub fn get(
        &self,
        (ptr, bytes, resolution): (u64, u64, Resolution),
        unchanged: impl Fn(&LocalBuffer, &Proof) -> bool,
    ) -> Option<LocalBuffer> {
        let mut slots = lock(&self.slots);
        let at = slots
            .entries
            .iter()
            .position(|e| (e.ptr, e.bytes, e.resolution) == (ptr, bytes, resolution))?;
        let entry = &slots.entries[at];
        if unchanged(&entry.buffer, &entry.proof) {
            return Some(entry.buffer);
        }
        slots.entries.swap_remove(at);
        None
    }

    /// `[ptr, ptr + bytes)` as a buffer of a remembered legacy or pool allocation, when the
    /// driver says (`identity`: range start, range size and buffer id at `ptr`, just asked) that
    /// the pointer lies in that very allocation and the range fits in it: the caching
    /// allocator's pattern, a new tensor carved from a segment exchanged before.
    pub fn carve(&self, identity: (u64, u64, u64), ptr: u64, bytes: u64) -> Option<LocalBuffer> {
        let (base, size, _) = identity;
        let end = ptr.checked_add(bytes)?;
        if bytes == 0 || ptr < base || end > base.checked_add(size)? {
            return None;
        }
        let slots = lock(&self.slots);
        let known = slots.entries.iter().find(|e| {
            e.proof == Proof::Allocation
                && (e.buffer.base, e.buffer.alloc_bytes, e.buffer.buffer_id) == identity
        })?;
        Some(LocalBuffer {
            ptr,
            bytes,
            ..known.buffer
        })
    }

    /// Remembers what `[ptr, ptr + bytes)` resolved to under `resolution`, replacing an older
    /// entry for it or, when every slot is taken, the slots in turn.
    pub fn remember(
        &self,
        (ptr, bytes, resolution): (u64, u64, Resolution),
        buffer: LocalBuffer,
        proof: Proof,
    ) {
        let entry = Entry {
            ptr,
            bytes,
            resolution,
            buffer,
            proof,
        };
        let mut slots = lock(&self.slots);
        let same = |e: &Entry| (e.ptr, e.bytes, e.resolution) == (ptr, bytes, resolution);
        if let Some(old) = slots.entries.iter_mut().find(|e| same(e)) {
            *old = entry;
        } else if slots.entries.len() < CAPACITY {
            slots.entries.push(entry);
        } else {
            let at = slots.next % CAPACITY;
            slots.entries[at] = entry;
            slots.next = at + 1;
        }
    }

    /// How many buffers are remembered.
    #[cfg(test)]
    pub fn count(&self) -> usize {
        lock(&self.slots).entries.len()
    }
}

#[cfg(test)]
mod tests;
