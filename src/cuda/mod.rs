//! Everything that touches the CUDA driver: loading it, contexts and devices ([`driver`]), each
//! raw call made once ([`result`]), what a device pointer is ([`memory`]), legacy IPC ([`ipc`]),
//! VMM buffers ([`vmm`]; widened in `vmm_runs`, imported in `vmm_map`), pool buffers (`pool`), the
//! import table and its releaser (`imports`), the semaphore slab ([`semaphore`]), the P2P protocol
//! ([`p2p`]), the device [`transport`] and contiguous views ([`view`]). Device buffers and probes
//! for programs and `nvfipc doctor` are the CLI's.
//!
//! What every transport of the process shares is one [`Runtime`]: CUDA opens a peer's allocation
//! once per context and retains a primary context once per device.

pub mod clock;
pub mod driver;
pub(crate) mod imports;
pub mod ipc;
pub mod memory;
pub mod p2p;
pub(crate) mod pool;
mod resolved;
pub mod result;
pub mod semaphore;
pub mod transport;
pub mod view;
pub mod vmm;
pub(crate) mod vmm_map;
pub(crate) mod vmm_runs;

use crate::error::Result;
use crate::sync::lock;
use driver::CudaContext;
use imports::ImportTable;
use memory::DeviceMemoryKind;
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Default bound of the mappings of one peer waiting to be closed before an exchange waits.
pub const DEFAULT_MAX_PENDING_PER_PEER: usize = 32;

/// This process's CUDA state: the import tables of the three kinds of peer memory (each with its
/// releaser), the legacy IPC exports, and what is queried once per device.
pub struct Runtime {
    pub(crate) ipc: ImportTable<ipc::Legacy>,
    pub(crate) vmm: ImportTable<vmm_map::Vmm>,
    pub(crate) pool: ImportTable<pool::Pool>,
    /// Legacy IPC exports, (buffer id, handle) by allocation base (one live allocation per base).
    pub(crate) exports: Mutex<HashMap<u64, (u64, ipc::HandleBytes)>>,
    /// VMM physical allocations exported (each once per transport).
    pub(crate) segment_exports: AtomicU64,
    /// Device UUIDs by ordinal.
    uuids: Mutex<HashMap<i32, [u8; 16]>>,
    /// Primary contexts retained, by device; never released (the host program may use them).
    pub(crate) primary: Mutex<HashMap<i32, CudaContext>>,
    /// Time spent in the driver's cold-path calls, when switched on.
    pub clock: clock::DriverClock,
}

// process-wide: CUDA maps a peer allocation once per context and a primary context once per
// device, so the imports, exports and contexts of every transport are the process's.
static RUNTIME: Lazy<Runtime> = Lazy::new(|| Runtime::new(DEFAULT_MAX_PENDING_PER_PEER));

/// The process's runtime (cheap; starts no thread and needs no driver until something is imported).
pub fn runtime() -> &'static Runtime {
    &RUNTIME
}

impl Runtime {
    /// Empty tables whose releasers let at most `max_pending_per_peer` closes of one peer wait.
    pub(crate) fn new(max_pending_per_peer: usize) -> Runtime {
        Runtime {
            ipc: ImportTable::new(ipc::Legacy::default(), max_pending_per_peer),
            vmm: ImportTable::new(vmm_map::Vmm::default(), max_pending_per_peer),
            pool: ImportTable::new(pool::Pool::default(), max_pending_per_peer),
            exports: Mutex::new(HashMap::new()),
            segment_exports: AtomicU64::new(0),
            uuids: Mutex::new(HashMap::new()),
            primary: Mutex::new(HashMap::new()),
            clock: clock::DriverClock::default(),
        }
    }

    /// Waits, at most `timeout`, until every peer mapping released so far (every kind) is closed;
    /// a `Timeout` saying how many are left otherwise (they stay queued).
    pub fn flush_releases(&self, timeout: Duration) -> Result<()> {
        self.ipc.flush(timeout)?;
        self.vmm.flush(timeout)?;
        self.pool.flush(timeout)
    }

    /// Waits, at most `timeout`, until no kind has more than its bound of `peer`'s closes waiting.
    pub(crate) fn wait_release_room(&self, peer: usize, timeout: Duration) -> Result<()> {
        self.ipc.wait_room(peer, timeout)?;
        self.vmm.wait_room(peer, timeout)?;
        self.pool.wait_room(peer, timeout)
    }

    /// The VMM and pool counters.
    pub fn vmm_counters(&self) -> VmmCounters {
        let (v, p) = (self.vmm.kind(), self.pool.kind());
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.vmm.inspect(|t, _| VmmCounters {
            segment_exports: load(&self.segment_exports),
            segment_imports: load(&v.segment_imports),
            segment_releases: load(&v.segment_releases),
            maps: load(&v.maps),
            unmaps: load(&v.unmaps),
            live_segments: t.side.len() as u64,
            live_maps: t.len() as u64,
            pool_imports: load(&p.imports),
            pool_frees: load(&p.frees),
            inside_mapped: load(&v.inside_mapped),
        })
    }

    /// The UUID of device `ordinal`, queried once per device.
    pub(crate) fn device_uuid(&self, ordinal: i32) -> Result<[u8; 16]> {
        if let Some(uuid) = lock(&self.uuids).get(&ordinal) {
            return Ok(*uuid);
        }
        let uuid = driver::device_uuid(ordinal)?;
        lock(&self.uuids).insert(ordinal, uuid);
        Ok(uuid)
    }
}

/// [`Runtime::flush_releases`] of the process's runtime.
pub fn flush_releases(timeout: Duration) -> Result<()> {
    runtime().flush_releases(timeout)
}

/// Counters of VMM and pool imports in this process, the fields of the C ABI's
/// `nvfipc_cuda_vmm_counters` (documented there); `live_maps` leaves out runs waiting for their
/// unmap, `live_segments` does not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VmmCounters {
    pub segment_exports: u64,
    pub segment_imports: u64,
    pub segment_releases: u64,
    pub maps: u64,
    pub unmaps: u64,
    pub live_segments: u64,
    pub live_maps: u64,
    pub pool_imports: u64,
    pub pool_frees: u64,
    pub inside_mapped: u64,
}

/// How the exchange exports the device buffer `[ptr, ptr + bytes)`; fails as [`memory::resolve`]
/// does, and for a VMM buffer that is not contiguous or spans too many physical allocations.
pub fn export_kind(ptr: u64, bytes: u64) -> Result<DeviceMemoryKind> {
    let alloc = memory::resolve(ptr, bytes)?;
    if let DeviceMemoryKind::Vmm { .. } = alloc.kind {
        vmm::resolve_run(&alloc)?;
    }
    Ok(alloc.kind)
}
