//! Handle exchange between ranks, over the transport contract ([`crate::transport`]) and a
//! [`Store`](crate::store::Store); it never names a concrete transport.
//!
//! - [`request`]: requests, the channels they name, and their board fingerprints;
//! - [`board`]: the node-local shared-memory board of per-channel steps and versions;
//! - [`peers`]: which peers share this node, learnt once per peer through the store;
//! - [`cache`]: [`HandleCache`], owner of the channel table (`channel`) and of the context
//!   (`context`: store, names, transports, boards, settings, counters) it hands the rest;
//! - `batch`: one call, whose items hold their channels' progress from `begin` until it commits,
//!   suspends or fails;
//! - `protocol`: the exchange protocol a batch runs over the context, with its one wait routine
//!   (`deadline`: the call's timeout and when it runs out);
//! - [`open_channel`]: a channel opened once for its transfers, stale once its buffers change;
//! - `teardown`: closing a cache without freeing what a peer may still map;
//! - `known` and `held`: records of peer allocations kept, so that a buffer carved from one
//!   needs no store fetch (`known`) or no store at all (`held`, listed on the board);
//! - [`retain`]: replaced peer mappings a cache keeps mapped for buffers carved again from them;
//! - [`stats`]: the cache's counters, and [`phases`]: where a call's time goes, when asked for;
//! - [`symmetric`]: symmetric memory (every member of a group maps every other's buffer) as one
//!   exchange, with no group-wide synchronisation.

mod batch;
pub mod board;
pub mod cache;
mod channel;
mod collector;
mod context;
mod deadline;
mod events;
mod held;
mod known;
pub mod open_channel;
pub mod peers;
pub mod phases;
mod protocol;
pub mod request;
pub mod retain;
mod settings;
pub mod stats;
pub mod symmetric;
mod teardown;
mod validity;

pub use crate::transport::record::{HandleType, Record};
pub use crate::transport::{LocalBuffer, Mapping, MemKind, P2pHandles, SemaphoreSlab, Transport};
pub use cache::{CacheConfig, HandleCache};
pub use open_channel::OpenChannel;
pub use request::{ChannelKey, Direction, Request};
pub use stats::CacheStats;
