//! Symmetric memory: every rank of a group maps every other rank's buffer, with no group-wide
//! synchronisation.
//!
//! A rendezvous of a group is one exchange in which each pair of the group talks over one
//! channel: the lower rank of the pair sends, the higher receives, both with their own buffer.
//! After the exchange each side holds the other's buffer mapped (the channel's peer pointer), so
//! a rank has waited only for the records and opens of the peers it maps, never for a barrier.
//! Being an ordinary exchange, it inherits everything the cache does: imports deduplicated and
//! refcounted per peer allocation, released when the buffer is replaced or the cache freed, and a
//! second rendezvous of the same buffers is a cache hit (no store traffic, no driver call).

use super::cache::HandleCache;
use super::request::Request;
use crate::barrier::MemberSet;
use crate::error::{Error, Result};
use crate::transport::MemKind;
use std::time::Duration;

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
fn requests(
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
        self.exchange_handles_timeout(&reqs, timeout)
            .map_err(|e| e.context(format!("symmetric rendezvous {tag:?}")))?;
        let mut out = Vec::with_capacity(group.len());
        let mut peers = reqs.iter();
        for &member in group.ranks() {
            if member == rank {
                out.push(PeerBuffer { rank, ptr, bytes });
                continue;
            }
            let req = peers.next().expect("one request per other member");
            let h = self.get(req)?;
            out.push(PeerBuffer {
                rank: member,
                ptr: h.peer_ptr,
                bytes: h.peer_bytes,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::request::Direction;

    #[test]
    fn each_pair_talks_over_one_channel_that_both_sides_name_alike() {
        let group = MemberSet::new(0, 8, Some(&[5, 0, 2, 7])).unwrap();
        let mut channels = std::collections::HashSet::new();
        for &rank in group.ranks() {
            let reqs = requests(
                rank,
                &group,
                "w",
                0x1000 * (rank as u64 + 1),
                64,
                MemKind::Host,
            );
            assert_eq!(reqs.len(), 3);
            for r in &reqs {
                assert_eq!(r.tag, "symm:w");
                let (src, dst) = match r.direction {
                    Direction::Send => (rank, r.peer),
                    Direction::Recv => (r.peer, rank),
                };
                assert!(src < dst, "the lower rank sends");
                channels.insert((src, dst, r.direction == Direction::Send));
            }
        }
        // 6 pairs, each seen once as a send and once as a receive.
        assert_eq!(channels.len(), 12);
    }
}
