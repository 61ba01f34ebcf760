//! Everything that touches the CUDA driver: loading it ([`driver`]), inspecting device pointers
//! ([`memory`]), legacy IPC export/import with dedup ([`ipc`]), the thread that closes replaced
//! mappings without blocking the exchange on device work ([`release`]), the per-process semaphore slab
//! ([`semaphore`]), the stream-ordered P2P protocol ([`p2p`]), the device [`transport`] used by
//! the exchange, and owned device buffers and streams for programs that drive it ([`buffer`]).

pub mod buffer;
pub mod driver;
pub mod ipc;
pub mod memory;
pub mod p2p;
pub mod release;
pub mod semaphore;
pub mod transport;
