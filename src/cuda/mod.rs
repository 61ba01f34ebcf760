//! Everything that touches the CUDA driver: loading it ([`driver`]), inspecting device pointers
//! ([`memory`]), legacy IPC export/import with dedup ([`ipc`]), the per-process semaphore slab
//! ([`semaphore`]), the stream-ordered P2P protocol ([`p2p`]) and the device [`transport`] used by
//! the exchange.

pub mod driver;
pub mod ipc;
pub mod memory;
pub mod p2p;
pub mod semaphore;
pub mod transport;
