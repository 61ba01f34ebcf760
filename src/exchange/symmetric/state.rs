//! What a cache remembers of each symmetric rendezvous, by tag: the members and this rank's
//! buffer as last given, and the contiguous view once asked for, with the identity of the
//! buffers it maps (a view of buffers that have since been replaced is dropped, not returned).

use crate::transport::view::ContiguousView;
use crate::transport::MemKind;
use std::collections::HashMap;

/// One member's buffer, told apart from any other: (rank, exporter pid, allocation id, offset
/// in the allocation, bytes). Allocation ids are never reused within a process.
pub(crate) type MemberId = (usize, u32, u64, u64, u64);

/// A contiguous view and the buffers it maps.
pub(crate) struct HeldView {
    pub ids: Vec<MemberId>,
    pub view: ContiguousView,
}

/// The last rendezvous of one tag.
pub(crate) struct Rendezvous {
    pub kind: MemKind,
    pub ptr: u64,
    pub bytes: u64,
    /// The members, sorted (this rank among them).
    pub members: Vec<usize>,
    pub view: Option<HeldView>,
}

impl Rendezvous {
    /// Whether `other` is a rendezvous of the same buffer and group.
    pub fn same_call(&self, other: &Rendezvous) -> bool {
        (self.kind, self.ptr, self.bytes, &self.members)
            == (other.kind, other.ptr, other.bytes, &other.members)
    }
}

/// The rendezvous of a cache, by tag (without the `symm:` prefix).
#[derive(Default)]
pub(crate) struct SymmetricTable {
    tags: HashMap<String, Rendezvous>,
}

impl SymmetricTable {
    /// Records a rendezvous of `tag`; the view of the previous one is kept only when the call
    /// was the same (whether its buffers still are is checked when the view is asked for).
    pub fn record(&mut self, tag: &str, mut now: Rendezvous) {
        if let Some(old) = self.tags.remove(tag) {
            if old.same_call(&now) {
                now.view = old.view;
            }
        }
        self.tags.insert(tag.to_string(), now);
    }

    pub fn get_mut(&mut self, tag: &str) -> Option<&mut Rendezvous> {
        self.tags.get_mut(tag)
    }

    pub fn get(&self, tag: &str) -> Option<&Rendezvous> {
        self.tags.get(tag)
    }

    /// Forgets `tag`, dropping its view.
    pub fn remove(&mut self, tag: &str) -> Option<Rendezvous> {
        self.tags.remove(tag)
    }

    /// Forgets every tag, dropping every view.
    pub fn clear(&mut self) {
        self.tags.clear();
    }

    /// Number of views held.
    pub fn views(&self) -> usize {
        self.tags.values().filter(|r| r.view.is_some()).count()
    }
}

#[cfg(test)]
mod tests;
