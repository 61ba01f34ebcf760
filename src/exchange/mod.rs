//! Handle exchange between ranks.
//!
//! - [`record`]: the versioned little-endian wire record of one exported buffer;
//! - [`transport`]: the contract with the memory transports (`crate::cuda`, `crate::host`);
//! - [`channel`]: requests, channels, and the store keys derived from them;
//! - [`board`]: the node-local shared-memory board of per-channel steps and versions;
//! - [`peers`]: which peers share this node, learnt once per peer through the store;
//! - [`cache`]: [`HandleCache`], the exchange protocol and its cache;
//! - [`retain`]: replaced peer mappings a cache keeps mapped for buffers carved again from them;
//! - [`epoch`]: epoch-valued semaphores shared by the host and device P2P primitives;
//! - [`stats`]: the cache's counters.

pub mod board;
pub mod cache;
pub mod channel;
mod collector;
pub mod epoch;
pub mod peers;
pub mod record;
pub mod retain;
pub mod stats;
pub mod transport;

pub use cache::{CacheConfig, HandleCache, P2pHandles};
pub use channel::{Direction, Request};
pub use record::{HandleType, Record};
pub use stats::CacheStats;
pub use transport::{LocalBuffer, Mapping, MemKind, SemaphoreSlab, Transport};
