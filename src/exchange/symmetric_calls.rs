//! The symmetric calls of a cache (`HandleCache::symmetric_*`): a rendezvous is one exchange of
//! the group's pairs; its requests and the table of rendezvous are in `symmetric.rs`.

use super::batch::Resolution;
use super::cache::HandleCache;
use super::symmetric::{
    member_id, not_rendezvoused, requests, HeldView, MemberId, PeerBuffer, Rendezvous,
};
use crate::barrier::MemberSet;
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::transport::view::ViewMember;
use crate::transport::MemKind;
use std::time::Duration;

// Symmetric memory (see `symmetric`): a rendezvous is one exchange of the group's pairs.
impl HandleCache {
    /// Maps every other member's buffer of a symmetric allocation: `ptr`/`bytes` is this rank's
    /// buffer, `group` the ranks taking part (the whole world when `None`; it must contain this
    /// rank), `tag` names the allocation (equal on every member). Returns one entry per member in
    /// increasing rank order, this rank's own included. Each rank waits only for the peers it
    /// maps; members may call in any order and other ranks are not involved. A second rendezvous
    /// of the same buffers is free.
    pub fn symmetric_rendezvous(
        &self,
        tag: &str,
        ptr: u64,
        bytes: u64,
        kind: MemKind,
        group: Option<&[usize]>,
        timeout: Duration,
    ) -> Result<Vec<PeerBuffer>> {
        let rank = self.rank();
        let group = MemberSet::new(rank, self.world_size(), group)
            .map_err(|e| e.context(format!("symmetric rendezvous {tag:?}")))?;
        if tag.is_empty() {
            return Err(Error::invalid(
                "symmetric rendezvous: the tag is empty; name the allocation (equal on every \
                 member)",
            ));
        }
        let reqs = requests(rank, &group, tag, ptr, bytes, kind);
        self.exchange_resolved_as(&reqs, timeout, Resolution::Exact)
            .map_err(|e| e.context(format!("symmetric rendezvous {tag:?}")))?;
        let members = group.ranks().to_vec();
        lock(&self.symmetric).record(
            tag,
            Rendezvous {
                kind,
                ptr,
                bytes,
                members,
                view: None,
            },
        );
        let mut peers = reqs.iter();
        let mut buffer = |member: usize| {
            if member == rank {
                return Ok(PeerBuffer { rank, ptr, bytes });
            }
            let h = self.get(peers.next().expect("one request per other member"))?;
            let (rank, ptr, bytes) = (member, h.peer_ptr, h.peer_bytes);
            Ok(PeerBuffer { rank, ptr, bytes })
        };
        group.ranks().iter().map(|&m| buffer(m)).collect()
    }

    /// Maps every member's buffer of the last rendezvous of `tag` again, in increasing rank
    /// order, into one reserved range: member i's buffer is at `base + i * stride` (returned as
    /// `(base, stride)`). The view is the cache's: asking again returns the same one, until a
    /// rendezvous of `tag` with other buffers, [`symmetric_release`](Self::symmetric_release) or
    /// the cache's end. Every member's buffer must have the same size and the same offset in its
    /// allocation granule (`InvalidArgument` names those that differ); device buffers must be VMM
    /// allocations (`Unsupported` otherwise).
    pub fn symmetric_contiguous_view(&self, tag: &str) -> Result<(u64, u64)> {
        let what = || format!("rank {}: contiguous view of {tag:?}", self.rank());
        let mut table = lock(&self.symmetric);
        let r = table
            .tags
            .get_mut(tag)
            .ok_or_else(|| not_rendezvoused(self.rank(), tag))?;
        let group = MemberSet::new(self.rank(), self.world_size(), Some(&r.members))?;
        let reqs = requests(self.rank(), &group, tag, r.ptr, r.bytes, r.kind);
        let t = self.cx.transports.get_or_make(r.kind)?;
        // Resolved again: a buffer freed since the rendezvous is refused, not mapped.
        let own = t.resolve(r.ptr, r.bytes).map_err(|e| e.context(what()))?;
        let peers = lock(&self.table)
            .peer_buffers(self.rank(), &reqs, tag)
            .map_err(|e| e.context(what()))?;
        let mut peer = peers.iter();
        let parts: Vec<ViewMember<'_>> = r
            .members
            .iter()
            .map(|&rank| match rank == self.rank() {
                true => ViewMember::Own { rank, buffer: own },
                false => {
                    let (record, mapping) = peer.next().expect("one request per other member");
                    ViewMember::Peer {
                        rank,
                        record,
                        mapping,
                    }
                }
            })
            .collect();
        let ids: Vec<MemberId> = parts.iter().map(member_id).collect();
        if let Some(held) = &r.view {
            if held.ids == ids {
                return Ok((held.view.base(), held.view.stride()));
            }
        }
        // The buffers changed since the view was made: it goes before the new one is made.
        r.view = None;
        let view = t.contiguous_view(&parts).map_err(|e| e.context(what()))?;
        let out = (view.base(), view.stride());
        r.view = Some(HeldView { ids, view });
        Ok(out)
    }

    /// Drops, in this process, what the rendezvous of `tag` mapped: its contiguous view and the
    /// guards of the peers' buffers (a mapping another channel shares stays). Local
    /// only: no store traffic, no waiting for peers. The pointers of the rendezvous and the view
    /// are invalid afterwards; a later rendezvous of `tag`, with the same buffers or others,
    /// works whatever the order in which the members released and came back.
    /// `InvalidArgument` when `tag` was not rendezvoused (or is released already).
    pub fn symmetric_release(&self, tag: &str) -> Result<()> {
        let mut table = lock(&self.symmetric);
        let r = table
            .tags
            .get(tag)
            .ok_or_else(|| not_rendezvoused(self.rank(), tag))?;
        let group = MemberSet::new(self.rank(), self.world_size(), Some(&r.members))?;
        let reqs = requests(self.rank(), &group, tag, r.ptr, r.bytes, r.kind);
        // The view goes first: it maps the memory of the imports released next.
        drop(table.tags.get_mut(tag).and_then(|r| r.view.take()));
        lock(&self.table)
            .release_peers(&self.cx, &reqs, tag)
            .map_err(|e| e.context(format!("releasing symmetric allocation {tag:?}")))?;
        table.tags.remove(tag);
        Ok(())
    }

    /// Number of contiguous views this cache holds.
    pub fn symmetric_views(&self) -> usize {
        lock(&self.symmetric).views()
    }
}
