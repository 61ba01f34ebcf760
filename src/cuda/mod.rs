//! Everything that touches the CUDA driver: loading it, its errors, contexts and devices
//! ([`driver`]), the raw memory, IPC and stream calls made once each ([`result`]), inspecting device pointers
//! ([`memory`]), legacy IPC export/import with dedup ([`ipc`]), VMM buffers exported per
//! physical allocation ([`vmm`]) and mapped back to back ([`vmm_map`]), stream-ordered pool
//! buffers ([`pool`]), the thread that closes replaced
//! mappings without blocking the exchange on device work ([`release`]), the per-process semaphore slab
//! ([`semaphore`]), the stream-ordered P2P protocol ([`p2p`]), and the device [`transport`] used by
//! the exchange, and the probes of `nvfipc doctor` ([`probe`]). Owned device buffers for programs and tests are outside the library
//! (`test_support::device_buffer`).

pub mod driver;
pub mod ipc;
pub mod memory;
pub mod p2p;
pub mod pool;
pub mod probe;
pub mod release;
pub mod result;
pub mod semaphore;
pub mod transport;
pub mod vmm;
pub mod vmm_map;
