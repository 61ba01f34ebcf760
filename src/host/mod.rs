//! The host transport: CPU buffers in POSIX shared memory, so the whole exchange protocol runs
//! across real processes on machines without a GPU.
//!
//! - [`alloc`]: the shared-memory allocator (`host::alloc`) and its registry of live segments;
//! - [`transport`]: the [`Transport`](crate::exchange::Transport) for [`MemKind::Host`](crate::exchange::MemKind);
//! - [`slab`]: the per-process semaphore slab in shared memory;
//! - [`p2p`]: the get-zcopy primitives (send post, recv post, send wait) on host memory;
//! - [`cleanup`]: names removed at exit and on termination, and reclaimed from dead processes;
//! - [`shm`] and [`wait`]: the segment wrapper and bounded waiting.

pub mod alloc;
pub mod cleanup;
pub mod p2p;
pub mod shm;
pub mod slab;
pub mod transport;
pub mod wait;

pub use alloc::{alloc, alloc_for_job, free, HostBuffer};
pub use transport::HostTransport;
