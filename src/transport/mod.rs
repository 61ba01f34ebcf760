//! The contract between the exchange and the memory transports (`crate::cuda`, `crate::host`):
//! the exchange never names a concrete transport and a transport never knows the exchange.
//! [`record`] is the wire record, [`epoch`] the P2P protocol both run, [`peer_maps`] the guards of
//! peer memory mapped here, [`slab`] the semaphore slab, [`set`] the transports a cache is handed,
//! [`view`] contiguous views.
//!
//! A [`Transport`] resolves a user pointer into its allocation, exports it into a [`Record`]'s
//! handle and imports a peer's record into a [`PeerMapping`], whose last guard releases it
//! without waiting for device work. Each transport owns one [`SemaphoreSlab`] per process,
//! exported once. All methods take `&self` and may be called from any thread.

pub mod epoch;
pub mod peer_maps;
pub mod record;
pub mod set;
pub mod slab;
pub mod view;

pub use epoch::P2pHandles;
pub use peer_maps::PeerMapping;
pub use set::Transports;
pub use slab::{slot_address, SemaphoreSlab, SLAB_BYTES};

use crate::error::{Error, Result};
use record::{HandleType, Record, Segment, PAYLOAD_LEN};
use std::time::Duration;

/// Which memory a request's pointer lives in.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemKind {
    /// CUDA device memory: `cudaMalloc`, VMM mappings, buffers of IPC-capable pools.
    Device = 0,
    /// Host memory from the shared-memory allocator (`host::alloc`).
    Host = 1,
}

impl MemKind {
    pub fn name(self) -> &'static str {
        match self {
            MemKind::Device => "device",
            MemKind::Host => "host",
        }
    }
}

/// Identity of a local buffer: the user's range and the allocation that contains it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LocalBuffer {
    /// The user's pointer.
    pub ptr: u64,
    /// The user's byte count.
    pub bytes: u64,
    /// Base of the exportable allocation containing `[ptr, ptr + bytes)`.
    pub base: u64,
    /// Size of that allocation.
    pub alloc_bytes: u64,
    /// Unique id of the allocation in this process (CUDA `BUFFER_ID`, or the host buffer's id).
    pub buffer_id: u64,
    /// UUID of the device holding the allocation; zero for host memory.
    pub device_uuid: [u8; 16],
}

impl LocalBuffer {
    /// Offset of `ptr` from the allocation base.
    pub fn offset(&self) -> u64 {
        self.ptr - self.base
    }
}

/// Handle bytes of an exported allocation or slab: what goes into a [`Record`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ExportedHandle {
    pub handle_type: HandleType,
    pub payload: [u8; PAYLOAD_LEN],
    /// The physical allocations behind the buffer (VMM, pools); empty otherwise.
    pub segments: Vec<Segment>,
}

impl ExportedHandle {
    /// A handle that is its payload alone (legacy IPC, fds of host memory, slabs).
    pub fn plain(handle_type: HandleType, payload: [u8; PAYLOAD_LEN]) -> ExportedHandle {
        ExportedHandle {
            handle_type,
            payload,
            segments: Vec::new(),
        }
    }
}

/// A record a transport offers to peers ([`Transport::seal_record`]); dropping it withdraws it.
pub type RecordSeal = Box<dyn std::any::Any + Send + Sync>;

/// Exports and imports buffers of one memory kind.
pub trait Transport: Send + Sync {
    fn kind(&self) -> MemKind;

    /// Finds the exportable allocation that contains `[ptr, ptr + bytes)`; `InvalidArgument`
    /// naming the pointer when it is NULL, of the other kind, unknown, or the range does not fit.
    fn resolve(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer>;

    /// [`resolve`](Transport::resolve) for a point-to-point exchange, which may name a larger
    /// allocation around the buffer (`cuda::vmm_runs`) that the peer maps once.
    fn resolve_shared(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer> {
        self.resolve(ptr, bytes)
    }

    /// Called before `buf` (from [`resolve_shared`](Transport::resolve_shared)) is exported to a
    /// peer that does not hold its allocation: `buf` itself while every part of its allocation
    /// is still mapped as when it was resolved, else the buffer resolved again.
    fn refresh(&self, buf: &LocalBuffer) -> Result<LocalBuffer> {
        Ok(*buf)
    }

    /// Exports the allocation of `buf`, cached per (base, buffer_id).
    fn export(&self, buf: &LocalBuffer) -> Result<ExportedHandle>;

    /// Maps the allocation of `rec` once per (exporter, allocation) while a guard of it lives;
    /// waits at most `wait` for a previous mapping of it still being closed.
    fn import(&self, rec: &Record, wait: Duration) -> Result<PeerMapping>;

    /// Offers the encoded `record`, published under the store key `key`, to peers through a
    /// channel that only processes the kernel vouches for reach (a record can name memory that
    /// any process could open); returns what goes into the store in its place, which names no
    /// memory, and the guard that keeps the record offered.
    fn seal_record(&self, key: &str, record: &[u8]) -> Result<(Vec<u8>, RecordSeal)>;

    /// The encoded record that `peer` sealed for the store key `key`, found from the `notice`
    /// read there (untrusted: the store is not), within `wait`.
    fn open_record(&self, peer: usize, key: &str, notice: &[u8], wait: Duration)
        -> Result<Vec<u8>>;

    /// Waits, at most `timeout`, until few enough of `peer`'s released mappings wait to be
    /// unmapped; `Timeout` naming the peer otherwise.
    fn wait_release_room(&self, _peer: usize, _timeout: Duration) -> Result<()> {
        Ok(())
    }

    /// Waits, at most `timeout`, until every mapping whose last guard was dropped so far is
    /// unmapped.
    fn flush_releases(&self, _timeout: Duration) -> Result<()> {
        Ok(())
    }

    /// This process's semaphore slab for this memory kind.
    fn semaphores(&self) -> &SemaphoreSlab;

    /// Number of peer allocations currently mapped (each counted once, whatever its guards).
    fn live_mappings(&self) -> usize;

    /// Maps `members` (this rank's buffer and the peers' this transport imported, held while this
    /// runs) again into one reserved range (see [`view`]); the view holds the memory on its own.
    fn contiguous_view(&self, _members: &[view::ViewMember<'_>]) -> Result<view::ContiguousView> {
        Err(Error::unsupported(format!(
            "contiguous views of {} memory are not supported by this transport",
            self.kind().name()
        )))
    }
}

#[cfg(test)]
mod tests;
