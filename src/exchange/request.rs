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
mod tests {
    use super::*;

    #[test]
    fn send_and_recv_name_the_same_channel() {
        let s = Request::send(1, "comm", 0x10, 4, MemKind::Host);
        let r = Request::recv(0, "comm", 0x20, 4, MemKind::Host);
        assert_eq!(ChannelKey::of(0, &s, 0), ChannelKey::of(1, &r, 0));
        let back = Request::send(0, "comm", 0x20, 4, MemKind::Host);
        assert_ne!(ChannelKey::of(0, &s, 0), ChannelKey::of(1, &back, 0));
    }

    #[test]
    fn occurrences_count_per_peer_direction_tag() {
        let reqs = vec![
            Request::send(1, "a", 1, 1, MemKind::Host),
            Request::send(1, "a", 2, 1, MemKind::Host),
            Request::recv(1, "a", 3, 1, MemKind::Host),
            Request::send(2, "a", 4, 1, MemKind::Host),
            Request::send(1, "a", 5, 1, MemKind::Host),
            Request::send(1, "b", 6, 1, MemKind::Host),
        ];
        assert_eq!(occurrences(&reqs), vec![0, 1, 0, 0, 2, 0]);
    }

    #[test]
    fn keys_are_unique_per_version_and_exporter() {
        let k = ChannelKey {
            src: 0,
            dst: 1,
            tag: "x/y".into(),
            occurrence: 0,
        };
        let names = CacheNames::new("job", "", 1);
        let a = k.record_key(&names, 0, 1);
        assert_eq!(a, "nvfipc/job//g1/h/0/1/0/1/x/y#0");
        assert_ne!(a, k.record_key(&names, 0, 2));
        assert_ne!(a, k.record_key(&names, 1, 1));
        assert_eq!(k.describe(), "0/1/x/y#0");
        let k2 = ChannelKey {
            tag: "x/y#0".into(),
            occurrence: 1,
            ..k.clone()
        };
        assert_ne!(k.describe(), k2.describe());
    }

    #[test]
    fn fingerprints_are_those_of_the_description() {
        let reqs = [
            Request::send(1, "comm", 1, 1, MemKind::Host),
            Request::recv(12, "x/y#0", 1, 1, MemKind::Host),
            Request::send(4095, "", 1, 1, MemKind::Device),
        ];
        for rank in [0, 3, 100_000] {
            for r in &reqs {
                for occ in [0, 1, 10, u32::MAX] {
                    let key = ChannelKey::of(rank, r, occ);
                    let fp = super::super::board::fingerprint(&key.describe());
                    assert_eq!(key.fingerprint(), fp, "{key}");
                    assert_eq!(fingerprint_of(rank, r, occ), fp, "{key}");
                    assert!(key.is_of(rank, r, occ));
                    assert!(!key.is_of(rank, r, occ.wrapping_add(1)));
                    assert!(!key.is_of(rank + 1, r, occ));
                }
            }
        }
        let other_tag = Request::send(1, "comm2", 1, 1, MemKind::Host);
        assert!(!ChannelKey::of(0, &reqs[0], 0).is_of(0, &other_tag, 0));
    }
}
