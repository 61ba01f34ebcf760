//! The host transport: CPU buffers in POSIX shared memory, so the whole exchange protocol runs
//! across real processes on machines without a GPU.
//!
//! - [`alloc`]: the shared-memory allocator (`host::alloc`) and its registry of live segments;
//! - [`transport`]: the [`Transport`](crate::transport::Transport) for [`MemKind::Host`](crate::transport::MemKind);
//! - [`slab`]: the per-process semaphore slab in shared memory;
//! - [`p2p`]: the get-zcopy primitives (send post, recv post, send wait) on host memory;
//!
//! Segments, bounded waits and the cleanup of names are OS helpers (`crate::os`).

pub mod alloc;
pub mod p2p;
pub mod slab;
pub mod transport;

pub use alloc::{alloc, alloc_for_job, free, HostBuffer};
pub use transport::HostTransport;
