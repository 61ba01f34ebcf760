//! Channels: what a request names, the cache's table of channels, and a channel opened for its
//! transfers ([`OpenChannel`]).
//!
//! A *channel* is one direction of one communication between two ranks, `(src, dst, tag,
//! occurrence)`, named identically by both whatever the order of their batches (the occurrence
//! counts earlier requests with the same peer, direction and tag in the batch).
//!
//! An opened channel keeps the channel's handles and its [`Validity`] as of the open: every change
//! of what they point to moves the generation on *before* the old mappings are released, and a
//! post compares generations (one atomic load) instead of looking the channel up.

use super::board::{Fingerprinter, PeerBoard};
use super::held::HeldMapping;
use super::peers::HeldRecords;
use super::session::{Imported, Session, Settings};
use crate::error::{Error, Result};
use crate::hash::FastMap;
use crate::names::CacheNames;
use crate::transport::epoch::TransferEpochs;
use crate::transport::record::Record;
use crate::transport::{LocalBuffer, MemKind, P2pHandles, PeerMapping, RecordSeal};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
    pub fn send(peer: usize, tag: impl Into<String>, ptr: u64, bytes: u64, kind: MemKind) -> Self {
        let tag = tag.into();
        let direction = Direction::Send;
        Request {
            peer,
            direction,
            tag,
            ptr,
            bytes,
            kind,
        }
    }

    pub fn recv(peer: usize, tag: impl Into<String>, ptr: u64, bytes: u64, kind: MemKind) -> Self {
        Request {
            direction: Direction::Recv,
            ..Self::send(peer, tag, ptr, bytes, kind)
        }
    }

    /// The (src, dst) ranks of this request's channel, issued by `rank`.
    fn ends(&self, rank: usize) -> (usize, usize) {
        match self.direction {
            Direction::Send => (rank, self.peer),
            Direction::Recv => (self.peer, rank),
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let to = match self.direction {
            Direction::Send => "to",
            Direction::Recv => "from",
        };
        write!(
            f,
            "{} {to} peer {} tag {:?} ({} buffer {:#x}, {} bytes)",
            self.direction.name(),
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
        let (src, dst) = req.ends(rank);
        ChannelKey {
            src,
            dst,
            tag: req.tag.clone(),
            occurrence,
        }
    }

    /// `*self == ChannelKey::of(rank, req, occurrence)`, without a copy.
    pub fn is_of(&self, rank: usize, req: &Request, occurrence: u32) -> bool {
        (self.src, self.dst) == req.ends(rank)
            && self.occurrence == occurrence
            && self.tag == req.tag
    }

    /// Unambiguous text form `src/dst/tag#occurrence` (the occurrence is always the digits after
    /// the last `#`), used for fingerprints and store keys.
    pub fn describe(&self) -> String {
        format!("{}/{}/{}#{}", self.src, self.dst, self.tag, self.occurrence)
    }

    /// Store key of the record that `exporter` published at buffer `version` on this channel.
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

/// `board::fingerprint(&ChannelKey::of(rank, req, occurrence).describe())`, without building the
/// key (the exchange computes it for every request of every call).
pub fn fingerprint_of(rank: usize, req: &Request, occurrence: u32) -> u128 {
    let (src, dst) = req.ends(rank);
    let mut f = Fingerprinter::new();
    f.write_decimal(src as u64);
    f.write(b"/");
    f.write_decimal(dst as u64);
    f.write(b"/");
    f.write(req.tag.as_bytes());
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

/// What a channel is, fixed when it is created (a call holds it through one `Arc`).
pub(super) struct ChannelInfo {
    pub key: ChannelKey,
    pub peer: usize,
    pub kind: MemKind,
    /// This rank's semaphore slot for the channel (`NO_SLOT`: none, a symmetric rendezvous).
    pub slot: u32,
    /// The channel's entry in this rank's board.
    pub entry: u32,
    pub fp: u128,
}

/// The peer's board and this channel's entry in it, once found. Moved into a call and back.
#[derive(Default)]
pub(super) struct PeerLink {
    pub board: Option<Arc<PeerBoard>>,
    pub entry: Option<u32>,
}

/// The peer's buffer and semaphore, mapped in this process (the buffer's guard is the channel's).
pub(super) struct PeerSide {
    pub mapping: HeldMapping,
    pub bytes: u64,
    pub semaphore: u64,
}

/// What a step did so far, which a call that timed out waiting for a peer leaves for the next
/// call on its channel (its step and version stay in its progress).
#[derive(Default)]
pub(super) struct Resume {
    /// The step sends new records (the channel's version changed since it last published).
    pub publish: bool,
    /// Its records are in the store already.
    pub sent: bool,
    /// The step sends no record: the peer holds the record of the buffer's allocation.
    pub known_to_peer: bool,
    /// The peer's buffer, opened already.
    pub staged: Option<Imported>,
}

/// A channel's progress, out of the table while a batch exchanges the channel. Kept small (what
/// only misses and suspended steps need is boxed), so that a warm call moves little.
#[derive(Default)]
pub(super) struct Progress {
    pub step: u64,
    pub version: u64,
    /// The version whose records this rank last sent.
    pub published: u64,
    /// The peer's version this rank last opened.
    pub peer_opened: u64,
    /// The record of the peer's buffer mapped in `peer_side` (its semaphore fields hold for all).
    pub peer_record: Option<Box<Record>>,
    /// Records of the peer's allocations held for the channel, listed on the board.
    pub held: HeldRecords,
    pub link: PeerLink,
    /// Set when a call timed out waiting for the peer: the step it left unfinished.
    pub resume: Option<Box<Resume>>,
    /// The record of this rank's buffer last sent on the channel, offered to the peer until the
    /// next one replaces it (the peer has opened it by then: a miss waits for that).
    pub sealed: Option<RecordSeal>,
}

pub(super) struct Channel {
    pub info: Arc<ChannelInfo>,
    /// This rank's buffer as last given to `exchange_handles`.
    pub local: Option<LocalBuffer>,
    pub peer_side: Option<PeerSide>,
    pub epochs: Arc<TransferEpochs>,
    /// The generation of the handles `local` and `peer_side` give.
    pub validity: Arc<Validity>,
    pub failed: Option<Error>,
    /// Out while a batch exchanges the channel (and for good once one failed on it).
    pub progress: Option<Progress>,
}

impl Channel {
    pub(super) fn new(info: ChannelInfo) -> Channel {
        Channel {
            info: Arc::new(info),
            local: None,
            peer_side: None,
            epochs: Arc::new(TransferEpochs::default()),
            validity: Arc::new(Validity::default()),
            failed: None,
            progress: Some(Progress::default()),
        }
    }

    /// Whether `local` has the identity of this channel's buffer (a change bumps the version).
    pub(super) fn holds(&self, local: &LocalBuffer) -> bool {
        let id = |l: &LocalBuffer| (l.base, l.buffer_id, l.offset(), l.bytes);
        self.local.as_ref().map(id) == Some(id(local))
    }
}

/// A cache's channels, under one lock (what it holds per peer is in the session).
#[derive(Default)]
pub(super) struct ChannelTable {
    pub channels: Vec<Channel>,
    /// Channel index by fingerprint (the channel's key is compared too).
    pub by_fp: FastMap<u128, usize>,
}

impl ChannelTable {
    /// The index of the channel of `req` issued by `rank` as its `occ`-th such request.
    pub(super) fn index_of(&self, rank: usize, req: &Request, occ: u32) -> Option<usize> {
        let i = *self.by_fp.get(&fingerprint_of(rank, req, occ))?;
        self.channels[i].info.key.is_of(rank, req, occ).then_some(i)
    }

    /// The peers' buffers, with their records, that the channels of the symmetric rendezvous
    /// `reqs` of `tag` map (a reference each, held while the caller uses them). Fails when one no
    /// longer maps its peer or is being exchanged.
    pub(super) fn peer_buffers(
        &self,
        rank: usize,
        reqs: &[Request],
        tag: &str,
    ) -> Result<Vec<(Box<Record>, PeerMapping)>> {
        reqs.iter()
            .map(|req| {
                let missing = || {
                    Error::state(format!(
                        "rank {rank}: symmetric allocation {tag:?} does not map rank {}'s buffer \
                         (released?); rendezvous again first",
                        req.peer
                    ))
                };
                let ch = &self.channels[self.index_of(rank, req, 0).ok_or_else(missing)?];
                let progress = ch
                    .progress
                    .as_ref()
                    .ok_or_else(|| busy(rank, tag, req.peer))?;
                match (&ch.peer_side, &progress.peer_record) {
                    (Some(side), Some(record)) => Ok((record.clone(), (*side.mapping).clone())),
                    _ => Err(missing()),
                }
            })
            .collect()
    }

    /// Drops the guards of the peers' mappings that the channels of `reqs` hold. Each keeps its
    /// protocol state and marks the peer's buffer as not opened (docs/PROTOCOL.md, "Symmetric
    /// memory"). Nothing is released when one of them is busy or suspended.
    pub(super) fn release_peers(
        &mut self,
        cx: &Session,
        reqs: &[Request],
        tag: &str,
    ) -> Result<()> {
        let found: Vec<(usize, usize)> = reqs
            .iter()
            .filter_map(|r| self.index_of(cx.rank, r, 0).map(|i| (i, r.peer)))
            .collect();
        for &(i, peer) in &found {
            let ch = &self.channels[i];
            match &ch.progress {
                None if ch.failed.is_none() => return Err(busy(cx.rank, tag, peer)),
                Some(p) if p.resume.is_some() => {
                    return Err(Error::state(format!(
                        "rank {}: the rendezvous of symmetric allocation {tag:?} timed out \
                         waiting for rank {peer} and is suspended; rendezvous again to finish it \
                         before releasing",
                        cx.rank
                    )))
                }
                _ => {}
            }
        }
        for (i, _) in found {
            let ch = &mut self.channels[i];
            drop(ch.peer_side.take());
            if let Some(p) = ch.progress.as_mut() {
                p.peer_opened = 0;
            }
        }
        Ok(())
    }
}

fn busy(rank: usize, tag: &str, peer: usize) -> Error {
    Error::state(format!(
        "rank {rank}: the channel of symmetric allocation {tag:?} with rank {peer} is being \
         exchanged by another thread, or failed earlier; calls on one tag must not overlap"
    ))
}

/// Generation of a channel whose cache was torn down.
const CLOSED: u64 = u64::MAX;
/// Generation of a channel whose last exchange failed.
const FAILED: u64 = u64::MAX - 1;

/// The generation of one channel's handles, shared with every handle opened on it: changed only
/// under the cache's table lock, read without any lock.
#[derive(Debug, Default)]
pub(super) struct Validity {
    generation: AtomicU64,
}

impl Validity {
    pub(super) fn current(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The channel's handles changed: handles opened before are stale.
    pub(super) fn bump(&self) {
        // Never reaches FAILED: one bump per exchange that changes a buffer.
        let _ = self
            .generation
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
                (g < FAILED - 1).then(|| g + 1)
            });
    }

    /// The channel failed in an exchange (its handles are unknown from here on).
    pub(super) fn fail(&self) {
        let _ = self
            .generation
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |g| {
                (g != CLOSED).then_some(FAILED)
            });
    }

    /// The cache is being torn down: no handle of the channel is usable again.
    pub(super) fn close(&self) {
        self.generation.store(CLOSED, Ordering::Release);
    }
}

/// One channel's handles (`HandleCache::open_channel`), usable for transfers until the channel's
/// buffers change or the cache is freed (then every use is an `InvalidState` error).
pub struct OpenChannel {
    handles: P2pHandles,
    info: Arc<ChannelInfo>,
    validity: Arc<Validity>,
    opened_at: u64,
    rank: usize,
    settings: Arc<Settings>,
}

impl OpenChannel {
    /// Call with the table lock held, under which the handles were resolved.
    pub(super) fn new(
        handles: P2pHandles,
        info: Arc<ChannelInfo>,
        validity: Arc<Validity>,
        rank: usize,
        settings: Arc<Settings>,
    ) -> OpenChannel {
        OpenChannel {
            handles,
            info,
            opened_at: validity.current(),
            validity,
            rank,
            settings,
        }
    }

    /// The handles, while the channel still holds the buffers it held at the open; otherwise an
    /// `InvalidState` error naming the channel and what to do.
    #[inline]
    pub fn handles(&self) -> Result<&P2pHandles> {
        let now = self.validity.current();
        if now == self.opened_at {
            Ok(&self.handles)
        } else {
            Err(self.stale(now))
        }
    }

    #[cold]
    fn stale(&self, now: u64) -> Error {
        let what = match now {
            CLOSED => "the cache it was opened from was freed (or closed); create a cache, \
                       exchange and open the channel again"
                .to_string(),
            FAILED => "the channel failed in a later exchange and is unusable; create a new \
                       cache"
                .to_string(),
            _ => format!(
                "a later exchange replaced the channel's buffers (generation {} -> {now}); \
                 re-open the channel after the exchange",
                self.opened_at
            ),
        };
        Error::state(format!(
            "rank {}: {} (peer {}, {} memory): {what}",
            self.rank,
            self.info.key,
            self.info.peer,
            self.info.kind.name()
        ))
    }

    /// The other rank of the channel.
    pub fn peer(&self) -> usize {
        self.info.peer
    }

    pub fn kind(&self) -> MemKind {
        self.info.kind
    }

    pub fn tag(&self) -> &str {
        &self.info.key.tag
    }

    /// Whether this rank sends on the channel (its buffer is the source).
    pub fn is_send(&self) -> bool {
        self.info.key.src == self.rank
    }

    /// The timeout of the cache the channel was opened from, as set now.
    pub fn timeout(&self) -> Duration {
        self.settings.timeout()
    }
}

#[cfg(test)]
mod tests;
