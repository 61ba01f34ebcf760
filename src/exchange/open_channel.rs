//! A channel opened once for its transfers ([`OpenChannel`], `HandleCache::open_channel`), so
//! that a post costs no request conversion, table lock or fingerprint: the handle keeps the
//! channel's resolved handles and the channel's [`Validity`] as of the open.
//!
//! Invalidation: every change of what the handles point to (this rank's buffer replaced at the
//! start of an exchange, the peer's mapping replaced at its commit), a failed exchange and the
//! cache's teardown move the channel's generation on *before* the old mappings are released. A
//! post first compares the generation it was opened at with the current one (one atomic load)
//! and touches nothing when they differ. As for the handles of `HandleCache::get`, posts on a
//! channel must not run while an exchange of that channel or the cache's teardown runs.

use super::channel::ChannelInfo;
use super::settings::Settings;
use super::validity::{Validity, CLOSED, FAILED};
use crate::error::{Error, Result};
use crate::transport::{MemKind, P2pHandles};
use std::sync::Arc;
use std::time::Duration;

/// One channel's handles, usable for transfers until the channel's buffers change (see the
/// module docs). Does not keep the cache alive: after the cache is freed every use is an
/// `InvalidState` error.
pub struct OpenChannel {
    handles: P2pHandles,
    info: Arc<ChannelInfo>,
    validity: Arc<Validity>,
    opened_at: u64,
    rank: usize,
    settings: Arc<Settings>,
}

impl OpenChannel {
    /// Reads the channel's generation now: call with the table lock held, with the handles
    /// resolved under the same lock.
    pub(super) fn new(
        handles: P2pHandles,
        info: Arc<ChannelInfo>,
        validity: Arc<Validity>,
        rank: usize,
        settings: Arc<Settings>,
    ) -> OpenChannel {
        let opened_at = validity.current();
        OpenChannel {
            handles,
            info,
            validity,
            opened_at,
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

    /// Whether [`handles`](Self::handles) would succeed now.
    pub fn is_current(&self) -> bool {
        self.validity.current() == self.opened_at
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

    /// The timeout of the cache the channel was opened from, as set now (host transfers use it
    /// when given none).
    pub fn timeout(&self) -> Duration {
        self.settings.timeout()
    }
}

#[cfg(test)]
mod tests;
