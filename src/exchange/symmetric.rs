//! Symmetric memory: every rank of a group maps every other rank's buffer, with no group-wide
//! synchronisation.
//!
//! A rendezvous is one exchange in which each pair of the group talks over one channel (the
//! lower rank sends); the cache remembers each by tag ([`SymmetricTable`]) for its contiguous
//! view and its release (docs/PROTOCOL.md, "Symmetric memory"). The calls themselves are
//! `HandleCache::symmetric_*` in `symmetric_calls.rs`; this file holds their requests and the table.

use super::channel::Request;
use crate::barrier::MemberSet;
use crate::error::Error;
use crate::transport::view::{ContiguousView, ViewMember};
use crate::transport::MemKind;
use std::collections::HashMap;

/// Prefix of the tags a rendezvous uses, so they never meet an application's own channels.
pub const TAG_PREFIX: &str = "symm:";

/// One peer's buffer as mapped in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerBuffer {
    pub rank: usize,
    /// The peer's buffer in this address space (this rank's own pointer for itself).
    pub ptr: u64,
    /// Its size as the peer gave it.
    pub bytes: u64,
}

/// This rank's requests of a rendezvous of `group` (validated, sorted) under `tag`.
pub(super) fn requests(
    rank: usize,
    group: &MemberSet,
    tag: &str,
    ptr: u64,
    bytes: u64,
    kind: MemKind,
) -> Vec<Request> {
    let tag = format!("{TAG_PREFIX}{tag}");
    group
        .ranks()
        .iter()
        .filter(|&&peer| peer != rank)
        .map(|&peer| {
            if rank < peer {
                Request::send(peer, tag.as_str(), ptr, bytes, kind)
            } else {
                Request::recv(peer, tag.as_str(), ptr, bytes, kind)
            }
        })
        .collect()
}

/// One member's buffer, told apart from any other: (rank, exporter pid, allocation id, offset
/// in the allocation, bytes). Allocation ids are never reused within a process.
pub(super) type MemberId = (usize, u32, u64, u64, u64);

pub(super) fn member_id(m: &ViewMember<'_>) -> MemberId {
    match *m {
        ViewMember::Own { rank, buffer } => (
            rank,
            std::process::id(),
            buffer.buffer_id,
            buffer.offset(),
            buffer.bytes,
        ),
        ViewMember::Peer { rank, record, .. } => (
            rank,
            record.pid,
            record.buffer_id,
            record.offset,
            record.bytes,
        ),
    }
}

pub(super) fn not_rendezvoused(rank: usize, tag: &str) -> Error {
    Error::invalid(format!(
        "rank {rank}: symmetric allocation {tag:?} was not rendezvoused in this cache (or was \
         released since); call nvfipc_symmetric_rendezvous with this tag first"
    ))
}

/// A contiguous view and the buffers it maps.
pub(super) struct HeldView {
    pub ids: Vec<MemberId>,
    pub view: ContiguousView,
}

/// The last rendezvous of one tag.
pub(super) struct Rendezvous {
    pub kind: MemKind,
    pub ptr: u64,
    pub bytes: u64,
    /// The members, sorted (this rank among them).
    pub members: Vec<usize>,
    pub view: Option<HeldView>,
}

/// The rendezvous of a cache, by tag (without the `symm:` prefix).
#[derive(Default)]
pub(super) struct SymmetricTable {
    pub tags: HashMap<String, Rendezvous>,
}

impl SymmetricTable {
    /// Records a rendezvous of `tag`; the view of the previous one is kept only when the call
    /// was the same (whether its buffers still are is checked when the view is asked for).
    pub fn record(&mut self, tag: &str, mut now: Rendezvous) {
        if let Some(old) = self.tags.remove(tag) {
            if (old.kind, old.ptr, old.bytes, &old.members)
                == (now.kind, now.ptr, now.bytes, &now.members)
            {
                now.view = old.view;
            }
        }
        self.tags.insert(tag.to_string(), now);
    }

    /// Number of views held.
    pub fn views(&self) -> usize {
        self.tags.values().filter(|r| r.view.is_some()).count()
    }
}

#[cfg(test)]
mod tests;
