//! Handle exchange between ranks: the wire record, the transport contract, and (built on them)
//! the epoch-keyed exchange protocol and the handle cache.

pub mod board;
pub mod cache;
pub mod channel;
pub mod epoch;
pub mod record;
pub mod transport;

pub use cache::{CacheConfig, CacheStats, HandleCache, P2pHandles};
pub use channel::{Direction, Request};
pub use record::{HandleType, Record};
pub use transport::{LocalBuffer, Mapping, MemKind, SemaphoreSlab, Transport};
