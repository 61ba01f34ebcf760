//! Handle exchange between ranks, over the transport contract ([`crate::transport`]) and a
//! [`Store`](crate::store::Store); it never names a concrete transport.
//!
//! - [`channel`]: requests, channels, and the store keys derived from them;
//! - [`board`]: the node-local shared-memory board of per-channel steps and versions;
//! - [`peers`]: which peers share this node, learnt once per peer through the store;
//! - [`cache`]: [`HandleCache`], the exchange protocol and its cache;
//! - [`retain`]: replaced peer mappings a cache keeps mapped for buffers carved again from them;
//! - [`stats`]: the cache's counters.

pub mod board;
pub mod cache;
pub mod channel;
mod collector;
pub mod peers;
pub mod retain;
pub mod stats;

pub use crate::transport::record::{HandleType, Record};
pub use crate::transport::{LocalBuffer, Mapping, MemKind, P2pHandles, SemaphoreSlab, Transport};
pub use cache::{CacheConfig, HandleCache};
pub use channel::{Direction, Request};
pub use stats::CacheStats;
