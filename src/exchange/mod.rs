//! Handle exchange between ranks, over the transport contract ([`crate::transport`]) and a
//! [`Store`](crate::store::Store); it never names a concrete transport.
//!
//! - [`request`]: requests, the channels they name, and their board fingerprints;
//! - [`board`]: the node-local shared-memory board of per-channel steps and versions;
//! - [`peers`]: which peers share this node, learnt once per peer through the store;
//! - [`cache`]: [`HandleCache`], its channel table (`channel`), settings (`settings`), and the
//!   parts of a call that hold the table's lock;
//! - `protocol`: the exchange protocol of one call, with its one wait routine (`deadline`: the
//!   call's timeout and when it runs out);
//! - `teardown`: closing a cache without freeing what a peer may still map;
//! - [`retain`]: replaced peer mappings a cache keeps mapped for buffers carved again from them;
//! - [`stats`]: the cache's counters;
//! - [`symmetric`]: symmetric memory (every member of a group maps every other's buffer) as one
//!   exchange, with no group-wide synchronisation.

pub mod board;
pub mod cache;
mod channel;
mod collector;
mod deadline;
mod events;
mod known;
pub mod peers;
mod protocol;
pub mod request;
pub mod retain;
mod settings;
pub mod stats;
pub mod symmetric;
mod teardown;

pub use crate::transport::record::{HandleType, Record};
pub use crate::transport::{LocalBuffer, Mapping, MemKind, P2pHandles, SemaphoreSlab, Transport};
pub use cache::{CacheConfig, HandleCache};
pub use request::{ChannelKey, Direction, Request};
pub use stats::CacheStats;
