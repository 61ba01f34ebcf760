//! Epoch-valued semaphores for the zero-copy "get" protocol (nvFuser's `get_zcopy`), shared by the
//! host primitives (`host::p2p`) and the device primitives (`cuda`).
//!
//! nvFuser's semaphores take two values (ready / in use), so a producer that runs a whole phase
//! ahead can overwrite a signal the consumer has not read yet. Here every transfer on a channel has
//! a number `n` (1, 2, ...), counted independently but identically by both sides, and a semaphore
//! only ever moves forward:
//!
//! - `send_post(n)`: the sender writes [`posted(n)`](posted) into the *receiver's* semaphore;
//! - `recv_post(n)`: the receiver waits until its own semaphore has [`reached`] `posted(n)`, pulls
//!   the data from the sender's buffer, then writes [`done(n)`](done) into the *sender's* semaphore;
//! - `send_wait(n)`: the sender waits until its own semaphore has reached `done(n)`.
//!
//! Waits are "greater or equal" in wrapping 32-bit arithmetic, so a later signal satisfies an
//! earlier wait and no signal can be lost. Semaphores start at zero (= `done(0)`).

use std::sync::atomic::{AtomicU64, Ordering};

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

/// Per-channel transfer counters of one rank. Shared (through an `Arc`) by every handle that
/// `HandleCache::get` returns for the channel, so the numbering survives buffer changes.
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

#[cfg(test)]
mod tests;
