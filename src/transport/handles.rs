//! What the exchange hands the P2P primitives of a transport (`cuda::p2p`, `host::p2p`) for one
//! channel: both sides' buffers and semaphores, mapped in this process.

use super::epoch::TransferEpochs;
use super::MemKind;
use crate::node::PeerProcess;
use std::sync::Arc;

/// Handles of one channel, as nvFuser's `P2pIpcHandle`: the local buffer and semaphore, and the
/// peer's, mapped in this process.
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
    /// Transfer counters of the channel (see [`epoch`](super::epoch)).
    pub epochs: Arc<TransferEpochs>,
    /// The peer's rank and process, so that transfer waits can tell when it has exited.
    pub peer: PeerProcess,
}
