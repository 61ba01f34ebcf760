//! The channel table of a cache: per channel (see [`request`](super::request)), what is fixed at
//! its creation, this rank's buffer and the peer's buffer mapped here, and its progress (step,
//! version, what was published and opened, the step a timed-out call left suspended), which
//! the batch exchanging the channel takes out and puts back.

use super::board::PeerBoard;
use super::held::HeldRecords;
use super::request::ChannelKey;
use super::validity::Validity;
use crate::error::Error;
use crate::transport::epoch::TransferEpochs;
use crate::transport::record::Record;
use crate::transport::{ExportedHandle, LocalBuffer, Mapping, MemKind};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

/// What a channel is, fixed when it is created. A call holds it through one `Arc`, so taking a
/// channel into a call copies nothing of it.
pub(super) struct ChannelInfo {
    pub key: ChannelKey,
    pub peer: usize,
    pub kind: MemKind,
    /// This rank's semaphore slot for the channel.
    pub slot: u32,
    /// The channel's entry in this rank's board.
    pub entry: u32,
    /// The channel's board fingerprint.
    pub fp: u128,
}

/// The peer's board and this channel's entry in it, once found. Moved into a call and back.
#[derive(Default)]
pub(super) struct PeerLink {
    pub board: Option<Arc<PeerBoard>>,
    pub entry: Option<u32>,
}

/// The buffer identity whose change bumps a channel's version.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Identity {
    base: u64,
    buffer_id: u64,
    offset: u64,
    bytes: u64,
}

impl Identity {
    fn of(local: &LocalBuffer) -> Identity {
        Identity {
            base: local.base,
            buffer_id: local.buffer_id,
            offset: local.offset(),
            bytes: local.bytes,
        }
    }
}

/// The peer's buffer and semaphore, mapped in this process.
pub(super) struct PeerSide {
    pub mapping: Mapping,
    pub bytes: u64,
    pub semaphore: u64,
}

/// A peer buffer opened by a call, not yet installed in its channel.
pub(super) struct Imported {
    pub kind: MemKind,
    pub mapping: Mapping,
    pub bytes: u64,
    pub sem_handle: ExportedHandle,
    pub sem_slot: u32,
    /// The peer's semaphore for the channel as mapped here; set by `map_peer_slabs` before the
    /// peer is told the buffer is opened (0 until then).
    pub semaphore: u64,
    /// The record it was imported from.
    pub record: Record,
}

/// What a call that timed out waiting for a peer leaves for the next call on its channel: the
/// step and version stay; records already sent are not sent again; a peer buffer already opened
/// is kept.
pub(super) struct Resume {
    pub publish: bool,
    pub sent: bool,
    /// Its step went through the board alone (no record in the store).
    pub known_to_peer: bool,
    pub staged: Option<Imported>,
}

/// A channel's progress through its steps. The batch that exchanges the channel moves it out of
/// the table and back when it ends; meanwhile the table has none (the channel is busy). Kept
/// small (what only misses and suspended steps need is boxed), so a warm call moves little.
#[derive(Default)]
pub(super) struct Progress {
    pub step: u64,
    pub version: u64,
    /// The version whose records this rank last sent.
    pub published: u64,
    /// The peer's version this rank last opened.
    pub peer_opened: u64,
    /// The record of the peer's buffer mapped in the channel's `peer_side` (its semaphore fields
    /// hold for every version of the channel).
    pub peer_record: Option<Box<Record>>,
    /// Records of the peer's allocations held for the channel, listed on the board (see `held`).
    pub held: HeldRecords,
    pub link: PeerLink,
    /// Set when a call timed out waiting for the peer: the step it left unfinished.
    pub resume: Option<Box<Resume>>,
}

pub(super) struct Channel {
    pub info: Arc<ChannelInfo>,
    /// This rank's buffer as last given to `exchange_handles`: its [`Identity`] decides the
    /// version; with `peer_side`, what `get` hands out.
    pub local: Option<LocalBuffer>,
    pub peer_side: Option<PeerSide>,
    pub epochs: Arc<TransferEpochs>,
    /// The generation of the handles `local` and `peer_side` give (see `open_channel`): moved on
    /// whenever either changes, before a replaced mapping is released.
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

    /// Whether `local` has the identity of this channel's buffer.
    pub(super) fn holds(&self, local: &LocalBuffer) -> bool {
        self.local.map(|l| Identity::of(&l)) == Some(Identity::of(local))
    }
}

/// Hashes a channel fingerprint, already uniformly distributed, by folding it (no SipHash on
/// the exchange path).
#[derive(Default)]
pub(super) struct FingerprintHasher(u64);

impl Hasher for FingerprintHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u128(&mut self, n: u128) {
        self.0 = (n as u64) ^ ((n >> 64) as u64);
    }
}

pub(super) type ByFingerprint = HashMap<u128, usize, BuildHasherDefault<FingerprintHasher>>;

/// A cache's channels, under one lock (what it holds per peer is in the context).
#[derive(Default)]
pub(super) struct ChannelTable {
    pub channels: Vec<Channel>,
    /// Channel index by fingerprint (the channel's key is compared too).
    pub by_fp: ByFingerprint,
}

#[cfg(test)]
mod tests;
