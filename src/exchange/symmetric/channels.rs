//! The channels of one rendezvous in the cache's channel table: what they hold of the members'
//! buffers (for a contiguous view), and the release of the peers' mappings they hold.
//!
//! A release drops only the mappings: a channel keeps its step, versions and the peer's record,
//! because the peer may still hold this rank's buffer and go on from the same state. It marks
//! the peer's buffer as not opened, so the next exchange of the channel imports it again, from
//! the kept record when the peer's buffer has not changed (no store traffic; see `protocol`).

use super::super::channel::ChannelTable;
use super::super::context::Context;
use super::super::request::{fingerprint_of, Request};
use super::state::MemberId;
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::transport::record::Record;
use crate::transport::{LocalBuffer, Mapping};
use std::sync::Mutex;

/// A member's buffer as the channel table holds it.
pub(crate) enum Member {
    Own {
        rank: usize,
        buffer: LocalBuffer,
    },
    Peer {
        rank: usize,
        /// Boxed: a record is large, and views are made rarely.
        record: Box<Record>,
        mapping: Mapping,
    },
}

impl Member {
    pub fn id(&self) -> MemberId {
        match self {
            Member::Own { rank, buffer } => (
                *rank,
                std::process::id(),
                buffer.buffer_id,
                buffer.offset(),
                buffer.bytes,
            ),
            Member::Peer { rank, record, .. } => (
                *rank,
                record.pid,
                record.buffer_id,
                record.offset,
                record.bytes,
            ),
        }
    }
}

/// The index of the channel of `req` (each request of a rendezvous is the only one of its peer,
/// direction and tag, so its occurrence is 0).
fn find(st: &ChannelTable, rank: usize, req: &Request) -> Option<usize> {
    st.by_fp
        .get(&fingerprint_of(rank, req, 0))
        .copied()
        .filter(|&i| st.channels[i].info.key.is_of(rank, req, 0))
}

/// The members of a rendezvous in rank order: `reqs` (its requests, in member order without this
/// rank) and this rank's `own` buffer, which goes at its place among `members`. Fails when a
/// channel no longer maps its peer (released) or is being exchanged.
pub(crate) fn members(
    cx: &Context,
    table: &Mutex<ChannelTable>,
    members: &[usize],
    reqs: &[Request],
    own: LocalBuffer,
    tag: &str,
) -> Result<Vec<Member>> {
    let st = lock(table);
    let mut peers = reqs.iter();
    members
        .iter()
        .map(|&rank| {
            if rank == cx.rank {
                return Ok(Member::Own { rank, buffer: own });
            }
            let req = peers.next().expect("one request per other member");
            let missing = || {
                Error::state(format!(
                    "rank {}: symmetric allocation {tag:?} does not map rank {rank}'s buffer \
                     (released?); rendezvous again first",
                    cx.rank
                ))
            };
            let ch = &st.channels[find(&st, cx.rank, req).ok_or_else(missing)?];
            let progress = ch
                .progress
                .as_ref()
                .ok_or_else(|| busy(cx.rank, tag, rank))?;
            let (Some(side), Some(record)) = (&ch.peer_side, &progress.peer_record) else {
                return Err(missing());
            };
            Ok(Member::Peer {
                rank,
                record: record.clone(),
                mapping: side.mapping,
            })
        })
        .collect()
}

fn busy(rank: usize, tag: &str, peer: usize) -> Error {
    Error::state(format!(
        "rank {rank}: the channel of symmetric allocation {tag:?} with rank {peer} is being \
         exchanged by another thread, or failed earlier; calls on one tag must not overlap"
    ))
}

/// Releases the peers' mappings that the channels of `reqs` hold (see the module docs). Nothing
/// is released when one of them is being exchanged or suspended in a timed-out step.
pub(crate) fn release_peers(
    cx: &Context,
    table: &Mutex<ChannelTable>,
    reqs: &[Request],
    tag: &str,
) -> Result<usize> {
    let mut st = lock(table);
    let found: Vec<(usize, usize)> = reqs
        .iter()
        .filter_map(|r| find(&st, cx.rank, r).map(|i| (i, r.peer)))
        .collect();
    for &(i, peer) in &found {
        let ch = &st.channels[i];
        match &ch.progress {
            None if ch.failed.is_none() => return Err(busy(cx.rank, tag, peer)),
            Some(p) if p.resume.is_some() => {
                return Err(Error::state(format!(
                    "rank {}: the rendezvous of symmetric allocation {tag:?} timed out waiting \
                     for rank {} and is suspended; rendezvous again to finish it before releasing",
                    cx.rank, peer
                )))
            }
            _ => {}
        }
    }
    let mut released = 0;
    for (i, _) in found {
        let ch = &mut st.channels[i];
        if let Some(side) = ch.peer_side.take() {
            cx.release_mapping(ch.info.kind, &side.mapping);
            released += 1;
        }
        if let Some(p) = ch.progress.as_mut() {
            p.peer_opened = 0;
        }
    }
    Ok(released)
}
