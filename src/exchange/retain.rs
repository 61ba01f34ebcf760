//! Peer allocations a cache keeps mapped after no channel uses them any more.
//!
//! nvFuser's buffers come from PyTorch's caching allocator: every iteration's tensors are carved
//! at new offsets from a few large segments. A channel whose buffer moves from one segment to
//! another would drop the last reference of the old segment's mapping, and the next move back
//! would open it again. So a replaced mapping is not released at once: the cache keeps up to a
//! bound of distinct peer allocations per (peer, memory kind) mapped, least recently replaced
//! first out, and a later import of one of them costs only a reference count (no driver open,
//! no close). The cache releases what it keeps when it is freed.
//!
//! What this costs: a kept mapping keeps the exporter's allocation mapped here; when the exporter
//! frees it, its memory is only returned once the mapping is released (evicted, or the cache
//! freed). With a bound of zero every replaced mapping is released at once.

use crate::transport::{Mapping, MemKind};
use std::collections::{HashMap, VecDeque};

/// Default number of distinct peer allocations kept per (peer, memory kind) and cache.
pub const DEFAULT_RETAINED_PER_PEER: usize = 8;

/// The mappings a cache keeps (one reference each), per (peer, kind), oldest first.
#[derive(Default)]
pub struct Retained {
    kept: HashMap<(usize, MemKind), VecDeque<Mapping>>,
}

fn same_allocation(a: &Mapping, b: &Mapping) -> bool {
    a.peer == b.peer && a.buffer_id == b.buffer_id && a.base == b.base
}

impl Retained {
    /// Takes over the reference of replaced mapping `m`. Returns the references to release now:
    /// `m` itself when one of its allocation is already kept or `limit` is zero, else the oldest
    /// kept ones beyond `limit`.
    pub fn retire(&mut self, kind: MemKind, m: Mapping, limit: usize) -> Vec<Mapping> {
        if limit == 0 {
            return vec![m];
        }
        let list = self.kept.entry((m.peer, kind)).or_default();
        if let Some(i) = list.iter().position(|k| same_allocation(k, &m)) {
            // Most recently replaced now; one reference of the allocation is enough.
            let kept = list.remove(i).expect("index from position");
            list.push_back(kept);
            return vec![m];
        }
        list.push_back(m);
        let excess = list.len().saturating_sub(limit);
        list.drain(..excess).collect()
    }

    /// Whether a mapping of `m`'s allocation is kept.
    pub fn holds(&self, kind: MemKind, m: &Mapping) -> bool {
        self.kept
            .get(&(m.peer, kind))
            .is_some_and(|list| list.iter().any(|k| same_allocation(k, m)))
    }

    /// Everything kept, to release (the cache's teardown).
    pub fn drain(&mut self) -> Vec<(MemKind, Mapping)> {
        self.kept
            .drain()
            .flat_map(|((_, kind), list)| list.into_iter().map(move |m| (kind, m)))
            .collect()
    }

    /// Number of mappings kept.
    pub fn len(&self) -> usize {
        self.kept.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
