//! Requests, channels and the names derived from them (board fingerprints, store keys).
//!
//! A *channel* is one direction of one communication between two ranks:
//! `(src, dst, tag, occurrence)`. A SEND request of rank `r` to `p` is channel `(r, p, tag, k)`,
//! the matching RECV request of `p` is `(r, p, tag, k)` as well, where `k` counts earlier requests
//! with the same (peer, direction, tag) in the same batch. Both ranks therefore name the channel
//! identically whatever the order of their batches.

use super::board::Fingerprinter;
use crate::names::CacheNames;
use crate::transport::MemKind;
use std::fmt;

/// Direction of a request, from the calling rank's point of view.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// This rank's buffer is the source: the peer pulls from it.
    Send = 0,
    /// This rank's buffer is the destination: it pulls from the peer.
    Recv = 1,
}

impl Direction {
    pub fn name(self) -> &'static str {
        match self {
            Direction::Send => "SEND",
            Direction::Recv => "RECV",
        }
    }
}

/// One point-to-point communication of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The other rank.
    pub peer: usize,
    pub direction: Direction,
    /// Equal on both ranks (nvFuser: the communication's name).
    pub tag: String,
    /// Local buffer address and size.
    pub ptr: u64,
    pub bytes: u64,
    pub kind: MemKind,
}

impl Request {
    pub fn new(
        peer: usize,
        direction: Direction,
        tag: impl Into<String>,
        ptr: u64,
        bytes: u64,
        kind: MemKind,
    ) -> Request {
        Request {
            peer,
            direction,
            tag: tag.into(),
            ptr,
            bytes,
            kind,
        }
    }

    pub fn send(peer: usize, tag: impl Into<String>, ptr: u64, bytes: u64, kind: MemKind) -> Self {
        Self::new(peer, Direction::Send, tag, ptr, bytes, kind)
    }

    pub fn recv(peer: usize, tag: impl Into<String>, ptr: u64, bytes: u64, kind: MemKind) -> Self {
        Self::new(peer, Direction::Recv, tag, ptr, bytes, kind)
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} peer {} tag {:?} ({} buffer {:#x}, {} bytes)",
            self.direction.name(),
            if self.direction == Direction::Send {
                "to"
            } else {
                "from"
            },
            self.peer,
            self.tag,
            self.kind.name(),
            self.ptr,
            self.bytes
        )
    }
}

/// The identity of a channel, equal on both ranks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChannelKey {
    pub src: usize,
    pub dst: usize,
    pub tag: String,
    pub occurrence: u32,
}

impl ChannelKey {
    /// The channel of `req` issued by `rank`, as the `occurrence`-th such request in its batch.
    pub fn of(rank: usize, req: &Request, occurrence: u32) -> ChannelKey {
        let (src, dst) = ends(rank, req);
        ChannelKey {
            src,
            dst,
            tag: req.tag.clone(),
            occurrence,
        }
    }

    /// Whether this is the channel of `req` issued by `rank` as the `occurrence`-th such
    /// request (what `*self == ChannelKey::of(rank, req, occurrence)` says, without a copy).
    pub fn is_of(&self, rank: usize, req: &Request, occurrence: u32) -> bool {
        (self.src, self.dst) == ends(rank, req)
            && self.occurrence == occurrence
            && self.tag == req.tag
    }

    /// The channel's board fingerprint: `board::fingerprint(&self.describe())`.
    pub fn fingerprint(&self) -> u128 {
        fingerprint_parts(self.src, self.dst, &self.tag, self.occurrence)
    }

    /// Unambiguous text form `src/dst/tag#occurrence` (the occurrence is always the digits after
    /// the last `#`), used for fingerprints and store keys.
    pub fn describe(&self) -> String {
        format!("{}/{}/{}#{}", self.src, self.dst, self.tag, self.occurrence)
    }

    /// Store key of the record that `exporter` published at buffer `version` on this channel
    /// of the cache named by `names` (see [`CacheNames::record_key`]).
    pub fn record_key(&self, names: &CacheNames, exporter: usize, version: u64) -> String {
        let channel = (self.src, self.dst, self.tag.as_str(), self.occurrence);
        names.record_key(channel, exporter, version)
    }
}

impl fmt::Display for ChannelKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "channel {} -> {} tag {:?}", self.src, self.dst, self.tag)?;
        if self.occurrence > 0 {
            write!(f, " (occurrence {})", self.occurrence)?;
        }
        Ok(())
    }
}

/// The (src, dst) ranks of the channel of `req` issued by `rank`.
fn ends(rank: usize, req: &Request) -> (usize, usize) {
    match req.direction {
        Direction::Send => (rank, req.peer),
        Direction::Recv => (req.peer, rank),
    }
}

/// The board fingerprint of the channel of `req` issued by `rank` as the `occurrence`-th such
/// request: `ChannelKey::of(rank, req, occurrence).fingerprint()` without building the key (the
/// exchange computes it for every request of every call).
pub fn fingerprint_of(rank: usize, req: &Request, occurrence: u32) -> u128 {
    let (src, dst) = ends(rank, req);
    fingerprint_parts(src, dst, &req.tag, occurrence)
}

/// Fingerprint of the description `src/dst/tag#occurrence` (see [`ChannelKey::describe`]), fed
/// piece by piece.
fn fingerprint_parts(src: usize, dst: usize, tag: &str, occurrence: u32) -> u128 {
    let mut f = Fingerprinter::new();
    f.write_decimal(src as u64);
    f.write(b"/");
    f.write_decimal(dst as u64);
    f.write(b"/");
    f.write(tag.as_bytes());
    f.write(b"#");
    f.write_decimal(u64::from(occurrence));
    f.finish()
}

/// Occurrence index of request `i` of a batch: how many earlier requests of the batch have the
/// same (peer, direction, tag).
pub fn occurrence(requests: &[Request], i: usize) -> u32 {
    // Batches are small (a few requests): a quadratic scan beats building a hash map.
    let r = &requests[i];
    requests[..i]
        .iter()
        .filter(|o| o.peer == r.peer && o.direction == r.direction && o.tag == r.tag)
        .count() as u32
}

/// [`occurrence`] of every request.
pub fn occurrences(requests: &[Request]) -> Vec<u32> {
    (0..requests.len())
        .map(|i| occurrence(requests, i))
        .collect()
}

#[cfg(test)]
mod tests;
