//! The host transport: CPU buffers in anonymous shared files passed between processes by file
//! descriptor (`crate::fdpass`), so the whole exchange protocol, fd passing included, runs across
//! real processes on machines without a GPU.
//!
//! - [`alloc`]: the shared-memory allocator (`host::alloc`) and its registry of live buffers;
//! - [`handle`]: a host handle on the wire (an fd id in a record's payload);
//! - [`transport`]: the [`Transport`](crate::transport::Transport) for [`MemKind::Host`](crate::transport::MemKind);
//! - [`slab`]: the per-process semaphore slab in shared memory;
//! - [`peer_maps`]: peers' buffers and slabs mapped here, refcounted, fetched once;
//! - [`p2p`]: the get-zcopy primitives (send post, recv post, send wait) on host memory;
//!
//! Anonymous files, mappings and bounded waits are OS helpers (`crate::os`).

pub mod alloc;
pub mod handle;
pub mod p2p;
pub mod peer_maps;
pub mod slab;
pub mod transport;

pub use alloc::{alloc, alloc_for_job, free, HostBuffer};
pub use transport::HostTransport;

/// Two fd transports (ranks 0 and 1 of `job`) on one in-memory store, abstract sockets only.
#[cfg(test)]
pub(crate) fn test_fdpass_pair(
    job: &str,
) -> (
    std::sync::Arc<crate::fdpass::FdPass>,
    std::sync::Arc<crate::fdpass::FdPass>,
) {
    use crate::fdpass::{FdPass, FdPassConfig};
    use std::sync::Arc;
    let store: Arc<dyn crate::store::Store> = Arc::new(crate::store::memory::MemoryStore::new());
    let config = FdPassConfig {
        socket_dir: None,
        ..FdPassConfig::default()
    };
    (
        Arc::new(FdPass::new(store.clone(), job, job, 0, config.clone())),
        Arc::new(FdPass::new(store, job, job, 1, config)),
    )
}
