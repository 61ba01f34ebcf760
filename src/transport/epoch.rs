//! The zero-copy "get" protocol (nvFuser's `get_zcopy`) as both transports run it (`host::p2p`,
//! `cuda::p2p`): the epoch values of its semaphores (PROTOCOL.md section 6), a channel's transfer
//! counters, and the handles and checks both take. Unlike nvFuser's two-valued semaphores, a
//! semaphore here only moves forward and waits are wrapping "greater or equal", so a producer that
//! runs a phase ahead cannot overwrite a signal not read yet. Semaphores start at zero (`done(0)`).

use super::MemKind;
use crate::error::{Error, Result};
use crate::node::PeerProcess;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Semaphore value meaning "the data of transfer `n` is ready to be pulled".
pub fn posted(n: u64) -> u32 {
    (n.wrapping_mul(2).wrapping_sub(1)) as u32
}

/// Semaphore value meaning "transfer `n` has been pulled; the sender may reuse its buffer".
pub fn done(n: u64) -> u32 {
    n.wrapping_mul(2) as u32
}

/// True when a semaphore holding `current` satisfies a wait for `target` (wrapping `>=`).
/// Correct as long as the two are less than 2^31 apart, i.e. 2^30 transfers.
pub fn reached(current: u32, target: u32) -> bool {
    (current.wrapping_sub(target) as i32) >= 0
}

/// Per-channel transfer counters of one rank, shared by every handle of the channel (so the
/// numbering survives buffer changes).
#[derive(Debug, Default)]
pub struct TransferEpochs {
    sends: AtomicU64,
    recvs: AtomicU64,
}

impl TransferEpochs {
    /// Starts the next send and returns its number.
    pub fn next_send(&self) -> u64 {
        self.sends.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Number of the last send started (0 before the first).
    pub fn last_send(&self) -> u64 {
        self.sends.load(Ordering::Acquire)
    }

    /// Starts the next receive and returns its number.
    pub fn next_recv(&self) -> u64 {
        self.recvs.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Number of the last receive started (0 before the first).
    pub fn last_recv(&self) -> u64 {
        self.recvs.load(Ordering::Acquire)
    }
}

/// One side of a channel as the calling rank sees it: its own buffer and semaphore, and the
/// peer's, mapped in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub local_ptr: u64,
    pub local_bytes: u64,
    pub local_semaphore: u64,
    pub peer_ptr: u64,
    /// Bytes the peer offers at `peer_ptr`.
    pub peer_bytes: u64,
    pub peer_semaphore: u64,
}

impl Endpoint {
    /// `InvalidArgument` naming the first NULL address.
    pub fn check(&self) -> Result<()> {
        for (name, value) in [
            ("local buffer", self.local_ptr),
            ("local semaphore", self.local_semaphore),
            ("peer buffer", self.peer_ptr),
            ("peer semaphore", self.peer_semaphore),
        ] {
            if value == 0 {
                return Err(Error::invalid(format!("P2P endpoint: {name} is NULL")));
            }
        }
        Ok(())
    }

    /// `InvalidArgument` unless a transfer of `bytes` fits both buffers.
    pub fn check_fits(&self, bytes: u64) -> Result<()> {
        if bytes > self.local_bytes || bytes > self.peer_bytes {
            return Err(Error::invalid(format!(
                "recv of {bytes} bytes does not fit: the local buffer has {} bytes and the peer's \
                 send buffer {} bytes",
                self.local_bytes, self.peer_bytes
            )));
        }
        Ok(())
    }
}

/// What the exchange hands the primitives for one channel, as nvFuser's `P2pIpcHandle`.
#[derive(Clone, Debug)]
pub struct P2pHandles {
    pub kind: MemKind,
    pub local_ptr: u64,
    pub local_bytes: u64,
    pub local_semaphore: u64,
    pub peer_ptr: u64,
    /// Bytes the peer offers at `peer_ptr`.
    pub peer_bytes: u64,
    pub peer_semaphore: u64,
    /// Transfer counters of the channel.
    pub epochs: Arc<TransferEpochs>,
    /// The peer's rank and process, so that transfer waits can tell when it has exited.
    pub peer: PeerProcess,
}

impl P2pHandles {
    /// The checked endpoint of handles that must be of `kind` memory (`InvalidArgument` else).
    pub fn endpoint(&self, kind: MemKind) -> Result<Endpoint> {
        if self.kind != kind {
            return Err(Error::invalid(format!(
                "the channel holds {} memory; the {} P2P primitives need {} buffers",
                self.kind.name(),
                kind.name(),
                kind.name()
            )));
        }
        let ep = Endpoint {
            local_ptr: self.local_ptr,
            local_bytes: self.local_bytes,
            local_semaphore: self.local_semaphore,
            peer_ptr: self.peer_ptr,
            peer_bytes: self.peer_bytes,
            peer_semaphore: self.peer_semaphore,
        };
        ep.check()?;
        Ok(ep)
    }

    /// The number of the last send posted, for `send_wait`; `InvalidState` before the first.
    pub fn last_posted(&self) -> Result<u64> {
        match self.epochs.last_send() {
            0 => Err(Error::state(
                "send_wait before any send_post on this channel: nothing to wait for",
            )),
            n => Ok(n),
        }
    }
}

#[cfg(test)]
mod tests;
