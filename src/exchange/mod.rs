//! Handle exchange between ranks, over the transport contract ([`crate::transport`]) and a
//! [`Store`](crate::store::Store); it never names a concrete transport. [`HandleCache`] (`cache`)
//! is the public surface; `batch` runs one call (its steps in `protocol`, its waits for peers in
//! `waits`) over the `session` (what a cache shares with its peers: store, boards, transports), on
//! the channels of the `channel` table and the node-local [`board`]; `peers` keeps what this rank
//! knows and holds of its peers, `collector` deletes consumed store records in the background, and
//! `symmetric` maps every member's buffer of a group as one exchange.

mod batch;
pub mod board;
mod cache;
mod channel;
mod collector;
mod held;
mod peers;
mod phases;
mod protocol;
mod session;
mod symmetric;
mod symmetric_calls;
mod teardown;
mod waits;

pub use crate::transport::{LocalBuffer, MemKind, P2pHandles, PeerMapping, Transport};
pub use cache::{CacheConfig, HandleCache};
pub use channel::{ChannelKey, Direction, OpenChannel, Request};
pub use peers::DEFAULT_RETAINED_PER_PEER;
pub use phases::PHASES;
pub use session::{CacheStats, DEFAULT_MAX_LINGER};
pub use symmetric::PeerBuffer;

#[cfg(test)]
mod tests;
