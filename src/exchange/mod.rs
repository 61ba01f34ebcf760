//! Handle exchange between ranks, over the transport contract ([`crate::transport`]) and a
//! [`Store`](crate::store::Store); it never names a concrete transport.
//!
//! - `cache`: [`HandleCache`], the public surface: it owns the channel table and the context,
//!   resolves a call's requests into a batch, and tears itself down without freeing what a peer
//!   may still map;
//! - `batch`: one call, whose items hold their channels' progress from `begin` until it commits,
//!   suspends or fails, and the exchange protocol it runs over the context (its waits, deadline,
//!   phase times and log lines);
//! - `channel`: requests, the channels they name (and their board fingerprints), the channel
//!   table, and a channel opened once for its transfers ([`OpenChannel`]), stale once its buffers
//!   change;
//! - [`board`]: the node-local shared-memory board of per-channel steps and versions;
//! - `context`: what the protocol and the teardown work with (store, names, transports, boards,
//!   settings and counters);
//! - `peers`: which peers share this node, and what this rank keeps of their allocations (known
//!   and held records, retained mappings);
//! - `collector`: the background deletes of consumed store records;
//! - `symmetric`: symmetric memory (every member of a group maps every other's buffer) as one
//!   exchange, with no group-wide synchronisation.

mod batch;
pub mod board;
mod cache;
mod channel;
mod collector;
mod context;
mod peers;
mod symmetric;

pub use crate::transport::record::{HandleType, Record};
pub use crate::transport::{LocalBuffer, Mapping, MemKind, P2pHandles, SemaphoreSlab, Transport};
pub use batch::{Phase, PhaseTimes, PHASES};
pub use cache::{CacheConfig, HandleCache};
pub use channel::{ChannelKey, Direction, OpenChannel, Request};
pub use context::{CacheStats, DEFAULT_MAX_LINGER};
pub use peers::DEFAULT_RETAINED_PER_PEER;
pub use symmetric::{PeerBuffer, TAG_PREFIX};

#[cfg(test)]
mod tests;
