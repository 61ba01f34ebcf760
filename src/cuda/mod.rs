//! Everything that touches the CUDA driver: loading it, its errors, contexts and devices
//! ([`driver`]), the raw memory, IPC and stream calls made once each ([`result`]), inspecting
//! device pointers ([`memory`]), legacy IPC export/import ([`ipc`]), VMM buffers exported per
//! physical allocation ([`vmm`]), widened for exchanges to aligned windows (`vmm_runs`) and mapped
//! back to back (`vmm_map`), stream-ordered pool buffers
//! (`pool`), the one import table that refcounts every kind's peer mappings and hands the last
//! reference to a releaser (`imports`), the thread that closes released mappings without blocking
//! the exchange on device work (`release`), the per-process semaphore slab ([`semaphore`]), the
//! stream-ordered P2P protocol ([`p2p`]), the device [`transport`] used by the exchange, the
//! contiguous views of symmetric VMM buffers ([`view`]). Owned device buffers for programs and
//! tests, and the probes of `nvfipc doctor`, are the CLI's (`cli/src/device_buffer.rs`,
//! `cli/src/doctor/probe.rs`).
//!
//! What the C API and the CLI use is public: [`transport::CudaTransport`], [`driver`], [`memory`],
//! [`p2p`], the low-level legacy IPC calls of [`ipc`], and the process-wide functions below
//! ([`flush_releases`], [`vmm_counters`], [`export_kind`]). The import side (`imports`,
//! `vmm_map`, `pool`, `release`) is private to the crate.

pub mod driver;
pub(crate) mod imports;
pub mod ipc;
pub mod memory;
pub mod p2p;
pub(crate) mod pool;
pub(crate) mod release;
pub mod result;
pub mod semaphore;
pub mod transport;
pub mod view;
pub mod vmm;
pub(crate) mod vmm_map;
pub(crate) mod vmm_runs;

use crate::error::Result;
use memory::DeviceMemoryKind;
use std::time::Duration;

/// Waits, at most `timeout`, until every peer mapping released so far (legacy IPC, VMM and pool
/// imports) has been closed by its releaser thread; a `Timeout` saying how many are left
/// otherwise (they stay queued and are closed later).
pub fn flush_releases(timeout: Duration) -> Result<()> {
    ipc::flush_releases(timeout)?;
    vmm_map::flush_releases(timeout)?;
    pool::flush_releases(timeout)
}

/// Back-pressure of the releases of `peer`'s mappings, every kind: waits, at most `timeout`,
/// until no kind has more than the per-peer bound of closes waiting.
pub(crate) fn wait_release_room(peer: usize, timeout: Duration) -> Result<()> {
    ipc::wait_release_room(peer, timeout)?;
    vmm_map::wait_release_room(peer, timeout)?;
    pool::wait_release_room(peer, timeout)
}

/// Counters of VMM and pool imports in this process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmmCounters {
    /// VMM physical allocations exported (each once per transport).
    pub segment_exports: u64,
    /// Peer physical allocations imported, and released.
    pub segment_imports: u64,
    pub segment_releases: u64,
    /// Runs of peer segments mapped, and unmapped.
    pub maps: u64,
    pub unmaps: u64,
    /// Peer segments imported and runs mapped now (runs waiting for their unmap are not
    /// counted; their segments are).
    pub live_segments: u64,
    pub live_maps: u64,
    /// Peer pool allocations imported, and freed.
    pub pool_imports: u64,
    pub pool_frees: u64,
    /// Peer VMM buffers served by the mapping of a larger run that holds their segments.
    pub inside_mapped: u64,
}

/// The process-wide VMM and pool counters.
pub fn vmm_counters() -> VmmCounters {
    let v = vmm_map::counters();
    let (pool_imports, pool_frees) = pool::counters();
    VmmCounters {
        segment_exports: v.exports,
        segment_imports: v.segment_imports,
        segment_releases: v.segment_releases,
        maps: v.maps,
        unmaps: v.unmaps,
        live_segments: v.live_segments,
        live_maps: v.live_runs,
        pool_imports,
        pool_frees,
        inside_mapped: v.inside_mapped,
    }
}

/// How the exchange exports the device buffer `[ptr, ptr + bytes)`: fails as
/// [`memory::resolve`] does, and for a VMM buffer that is not contiguous or spans more physical
/// allocations than a record holds.
pub fn export_kind(ptr: u64, bytes: u64) -> Result<DeviceMemoryKind> {
    let alloc = memory::resolve(ptr, bytes)?;
    if let DeviceMemoryKind::Vmm { .. } = alloc.kind {
        vmm::resolve_run(&alloc)?;
    }
    Ok(alloc.kind)
}
