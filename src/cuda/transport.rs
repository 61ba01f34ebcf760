//! [`Transport`] for device memory, choosing the export per buffer from its pointer attributes
//! (`memory::classify`): legacy IPC ([`ipc`]), VMM segments as POSIX fds or FABRIC handles
//! ([`vmm`] exports, `vmm_map` imports), stream-ordered pools (`pool`); plus the device semaphore
//! slab. Imports go through the process's [`Runtime`] tables: a guard holds its import there (so
//! it may outlive the transport), and its last drop hands the mapping to the kind's releaser.
//! VMM and pool buffers travel as fds through the fd transport given to
//! [`CudaTransport::with_fdpass`]; without one only legacy and FABRIC buffers can be shared.

use super::driver;
use super::ipc;
use super::memory::{self, DeviceAllocation, DeviceMemoryKind, PointerInfo};
use super::pool::{self, PoolExports};
use super::resolved::{Proof, Resolution, Resolved};
use super::vmm::{self, LocalSegment, Run, VmmExports};
use super::vmm_map;
use super::vmm_runs::{self, WideRuns};
use super::{runtime, Runtime};
use crate::error::{Error, Result};
use crate::fdpass::FdPass;
use crate::transport::peer_maps::PeerMaps;
use crate::transport::record::{HandleType, Record};
use crate::transport::view::{ContiguousView, ViewMember};
use crate::transport::{
    ExportedHandle, LocalBuffer, MemKind, PeerMapping, RecordSeal, SemaphoreSlab, Transport,
};
use std::sync::Arc;
use std::time::Duration;

/// One reference on a peer allocation in the import table of its kind, released on drop.
#[derive(Debug)]
enum HeldImport {
    Legacy(ipc::IpcImport),
    Vmm(vmm_map::VmmImport),
    Pool(pool::PoolImport),
}

impl HeldImport {
    fn base(&self) -> u64 {
        match self {
            HeldImport::Legacy(i) => i.base(),
            HeldImport::Vmm(i) => i.base(),
            HeldImport::Pool(i) => i.base(),
        }
    }

    /// Whether both hold the same import (the same peer allocation mapped here).
    fn same_import(&self, other: &HeldImport) -> bool {
        match (self, other) {
            (HeldImport::Legacy(a), HeldImport::Legacy(b)) => a.key() == b.key(),
            (HeldImport::Vmm(a), HeldImport::Vmm(b)) => a.key() == b.key(),
            (HeldImport::Pool(a), HeldImport::Pool(b)) => a.key() == b.key(),
            _ => false,
        }
    }
}

/// (peer, exporter buffer id, base of the mapping here).
type ImportKey = (usize, u64, u64);

/// The device transport (see the module docs).
pub struct CudaTransport {
    rt: &'static Runtime,
    device: Option<i32>,
    fdpass: Option<Arc<FdPass>>,
    vmm_exports: VmmExports,
    /// VMM runs widened for exchanges (see `vmm_runs`).
    wide_runs: WideRuns,
    /// The window of `NVFIPC_VMM_WINDOW_MIB` in bytes; 0: exchanges export exact VMM runs.
    window: u64,
    pool_exports: PoolExports,
    /// Buffers resolved before, checked with one short driver query on a cached exchange.
    resolved: Resolved,
    slab: SemaphoreSlab,
    /// The live mappings, one per key. The base is part of the key: one peer buffer can be
    /// served by several mapped runs at once, each released to the run that served it.
    imports: PeerMaps<ImportKey>,
}

/// `exact`, the run of the VMM buffer `alloc` (whose pointer `info` describes), widened within
/// its reserved range (see `vmm_runs`).
fn widened(exact: Run, info: &PointerInfo, alloc: &DeviceAllocation, window: u64) -> Run {
    let range = match info.range_start.checked_add(info.range_size) {
        Some(end) if info.range_size > 0 && info.range_start <= exact.base() => {
            (info.range_start, end)
        }
        // A driver that does not report the reserved range: no widening.
        _ => (exact.base(), exact.base() + exact.size()),
    };
    let handle_types = exact.segments[0].handle_types;
    vmm_runs::widen(exact, alloc.ptr, alloc.bytes, window, range, |at| {
        vmm_segment_at(at, handle_types)
    })
}

/// The VMM segment mapped at `at`, if it can be exported as `handle_types`.
fn vmm_segment_at(at: u64, handle_types: u32) -> Option<LocalSegment> {
    let alloc = memory::classify(&memory::query(at).ok()?, 1).ok()?;
    LocalSegment::of(&alloc).filter(|s| s.handle_types == handle_types)
}

/// Whether the driver still vouches for `proof` of the remembered `buffer` (see `resolved`).
fn unchanged(buffer: &LocalBuffer, proof: &Proof) -> bool {
    match proof {
        Proof::Allocation => {
            memory::allocation_identity(buffer.ptr)
                == Some((buffer.base, buffer.alloc_bytes, buffer.buffer_id))
        }
        Proof::Segments(segments) => segments
            .iter()
            .all(|s| memory::segment_identity(s.base) == Some((s.base, s.size, s.id))),
    }
}

impl CudaTransport {
    /// A transport on `device` (`None`: the current one at each call, as under nvFuser), sharing
    /// VMM and pool buffers as fds through `fdpass` (the job's fd transport, shared with the host
    /// transport; without one, legacy and FABRIC buffers only); `CudaUnavailable` without a driver.
    pub fn with_fdpass(
        device: Option<i32>,
        fdpass: Option<Arc<FdPass>>,
    ) -> Result<Arc<CudaTransport>> {
        driver::driver()?;
        let window = crate::config::vmm_window_from_lookup(crate::config::process_env)?;
        Ok(Arc::new(Self::unloaded(device, fdpass, window)))
    }

    fn unloaded(device: Option<i32>, fdpass: Option<Arc<FdPass>>, window: u64) -> CudaTransport {
        let rt = runtime();
        CudaTransport {
            rt,
            device,
            vmm_exports: VmmExports::new(rt, fdpass.clone()),
            wide_runs: WideRuns::default(),
            window,
            pool_exports: PoolExports::new(fdpass.clone()),
            resolved: Resolved::default(),
            fdpass,
            slab: super::semaphore::new_slab(rt, device),
            imports: PeerMaps::default(),
        }
    }

    /// A buffer of the legacy or pool allocation `alloc`.
    fn buffer_of_allocation(&self, alloc: &DeviceAllocation) -> Result<LocalBuffer> {
        Ok(LocalBuffer {
            ptr: alloc.ptr,
            bytes: alloc.bytes,
            base: alloc.base,
            alloc_bytes: alloc.size,
            buffer_id: alloc.buffer_id,
            device_uuid: self.rt.device_uuid(alloc.device_ordinal)?,
        })
    }

    /// A buffer of the VMM allocation `alloc`, exported as `run`.
    fn buffer_of_run(&self, alloc: &DeviceAllocation, run: &Run) -> Result<LocalBuffer> {
        Ok(LocalBuffer {
            base: run.base(),
            alloc_bytes: run.size(),
            buffer_id: run.id(),
            ..self.buffer_of_allocation(alloc)?
        })
    }

    /// The buffer `key` names as remembered (see `resolved`): the same range proven unchanged, or
    /// a new range inside a legacy or pool allocation remembered before (remembered in turn).
    fn remembered(&self, key: (u64, u64, Resolution)) -> Option<LocalBuffer> {
        if let Some(buffer) = self.resolved.get(key, unchanged) {
            return Some(buffer);
        }
        let (ptr, bytes, _) = key;
        let buffer = self
            .resolved
            .carve(memory::allocation_identity(ptr)?, ptr, bytes)?;
        self.resolved.remember(key, buffer, Proof::Allocation);
        Some(buffer)
    }

    /// The VMM run `buf` was resolved to: remembered, exact (symmetric rendezvous) or widened
    /// again; an error if none is the one `buf` names.
    fn run_of(&self, buf: &LocalBuffer, alloc: &DeviceAllocation) -> Result<Run> {
        if let Some(run) = self.wide_runs.get(buf.base, buf.buffer_id) {
            return Ok((*run).clone());
        }
        let exact = vmm::resolve_run(alloc)?;
        let names = |run: &Run| (run.base(), run.id()) == (buf.base, buf.buffer_id);
        if names(&exact) {
            return Ok(exact);
        }
        let run = widened(exact, &memory::query(buf.ptr)?, alloc, self.window);
        if names(&run) {
            return Ok(self.wide_runs.remember(run).as_ref().clone());
        }
        Err(Error::invalid(format!(
            "the VMM allocations around buffer {:#x} (+{}) changed while it was being exchanged \
             (resolved to {} bytes at {:#x}, now {} bytes at {:#x}); memory must stay mapped \
             during an exchange: call again",
            buf.ptr,
            buf.bytes,
            buf.alloc_bytes,
            buf.base,
            run.size(),
            run.base()
        )))
    }

    /// The fd transport that carries this transport's records: a CUDA IPC or FABRIC handle is a
    /// capability any process can open, so records never travel without it.
    fn private_channel(&self) -> Result<&Arc<FdPass>> {
        self.fdpass.as_ref().ok_or_else(|| {
            Error::unsupported(
                "this CUDA transport was made without an fd transport, and handle records \
                 travel only through one (never through the store, which other users can \
                 read): make it with CudaTransport::with_fdpass(device, Some(fdpass))",
            )
        })
    }

    /// Opens `rec` with the module of its handle type.
    fn open(&self, peer: usize, rec: &Record, wait: Duration) -> Result<HeldImport> {
        let fdpass = self.fdpass.as_deref();
        match rec.handle_type {
            HandleType::CudaLegacyIpc => {
                let (pid, handle) = (Some(rec.pid), &rec.payload);
                ipc::import(self.rt, peer, pid, handle, self.device, wait).map(HeldImport::Legacy)
            }
            HandleType::CudaVmmFd | HandleType::CudaVmmFabric => {
                vmm_map::import(self.rt, peer, rec, fdpass, self.device, wait).map(HeldImport::Vmm)
            }
            HandleType::CudaPool => {
                pool::import(self.rt, peer, rec, fdpass, self.device, wait).map(HeldImport::Pool)
            }
            HandleType::PosixFd => Err(Error::invalid(format!(
                "record of rank {} holds a {} handle; the device transport only opens device \
                 memory handles",
                rec.rank,
                rec.handle_type.name()
            ))),
        }
    }
}

impl Transport for CudaTransport {
    fn kind(&self) -> MemKind {
        MemKind::Device
    }

    fn resolve(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer> {
        let key = (ptr, bytes, Resolution::Exact);
        if let Some(buffer) = self.remembered(key) {
            return Ok(buffer);
        }
        let alloc = memory::resolve(ptr, bytes)?;
        let (buffer, proof) = match alloc.kind {
            DeviceMemoryKind::Vmm { .. } => {
                let run = vmm::resolve_run(&alloc)?;
                (
                    self.buffer_of_run(&alloc, &run)?,
                    Proof::Segments(run.segments),
                )
            }
            DeviceMemoryKind::Legacy | DeviceMemoryKind::Pool { .. } => {
                (self.buffer_of_allocation(&alloc)?, Proof::Allocation)
            }
        };
        self.resolved.remember(key, buffer, proof);
        Ok(buffer)
    }

    fn resolve_shared(&self, ptr: u64, bytes: u64) -> Result<LocalBuffer> {
        if ptr == 0 || self.window == 0 {
            return self.resolve(ptr, bytes);
        }
        let key = (ptr, bytes, Resolution::Shared);
        if let Some(buffer) = self.remembered(key) {
            return Ok(buffer);
        }
        let info = memory::query(ptr)?;
        let alloc = memory::classify(&info, bytes)?;
        let (buffer, proof) = match alloc.kind {
            DeviceMemoryKind::Vmm { .. } => {
                let exact = vmm::resolve_run(&alloc)?;
                let run = self
                    .wide_runs
                    .resolve(exact, |exact| widened(exact, &info, &alloc, self.window));
                let buffer = self.buffer_of_run(&alloc, &run)?;
                (buffer, Proof::Segments(run.segments.clone()))
            }
            DeviceMemoryKind::Legacy | DeviceMemoryKind::Pool { .. } => {
                (self.buffer_of_allocation(&alloc)?, Proof::Allocation)
            }
        };
        self.resolved.remember(key, buffer, proof);
        Ok(buffer)
    }

    fn refresh(&self, buf: &LocalBuffer) -> Result<LocalBuffer> {
        if self.window == 0 {
            return Ok(*buf);
        }
        let info = memory::query(buf.ptr)?;
        let alloc = memory::classify(&info, buf.bytes)?;
        let DeviceMemoryKind::Vmm { .. } = alloc.kind else {
            return Ok(*buf);
        };
        let fresh = self.wide_runs.refresh(
            buf.base,
            buf.buffer_id,
            |s| vmm_segment_at(s.base, s.handle_types).as_ref() == Some(s),
            || vmm::resolve_run(&alloc),
            |exact| widened(exact, &info, &alloc, self.window),
        )?;
        match fresh {
            None => Ok(*buf),
            Some(run) => self.buffer_of_run(&alloc, &run),
        }
    }

    fn export(&self, buf: &LocalBuffer) -> Result<ExportedHandle> {
        // Only on a miss: the kind (and a VMM buffer's segments) are looked up again.
        let exported = memory::resolve(buf.ptr, buf.bytes).and_then(|alloc| match alloc.kind {
            DeviceMemoryKind::Legacy => ipc::export(self.rt, buf.base, buf.buffer_id)
                .map(|payload| ExportedHandle::plain(HandleType::CudaLegacyIpc, payload)),
            DeviceMemoryKind::Vmm { .. } => self
                .run_of(buf, &alloc)
                .and_then(|run| self.vmm_exports.export(&run)),
            DeviceMemoryKind::Pool { .. } => self.pool_exports.export(&alloc),
        });
        exported.map_err(|e| e.context(format!("exporting device buffer {:#x}", buf.ptr)))
    }

    fn import(&self, rec: &Record, wait: Duration) -> Result<PeerMapping> {
        let peer = rec.rank as usize;
        let held = self.open(peer, rec, wait).map_err(|e| {
            e.context(format!(
                "importing buffer {} of rank {peer} (pid {}, host {})",
                rec.buffer_id,
                rec.pid,
                rec.host_name()
            ))
        })?;
        let base = held.base();
        let key = (peer, rec.buffer_id, base);
        if let Some(live) = self.imports.get(&key, rec.offset) {
            // The reference just taken is dropped: the live guard holds one on the same import.
            return match live.memory::<HeldImport>() {
                Some(first) if first.same_import(&held) => Ok(live),
                // Two live mappings at one address cannot exist: the driver would have refused.
                first => Err(Error::internal(format!(
                    "buffer {} of rank {peer} (pid {}) was mapped at {base:#x} by {first:?} and \
                     now by {held:?}",
                    rec.buffer_id, rec.pid
                ))),
            };
        }
        let opened = PeerMapping::new(peer, base, rec.alloc_bytes, rec.buffer_id, held);
        Ok(self.imports.insert(key, opened.at(rec.offset)))
    }

    fn seal_record(&self, key: &str, record: &[u8]) -> Result<(Vec<u8>, RecordSeal)> {
        let (notice, sealed) = self.private_channel()?.seal_record(key, record)?;
        Ok((notice.to_vec(), Box::new(sealed)))
    }

    fn open_record(
        &self,
        peer: usize,
        key: &str,
        notice: &[u8],
        wait: Duration,
    ) -> Result<Vec<u8>> {
        self.private_channel()?.open_record(peer, key, notice, wait)
    }

    fn wait_release_room(&self, peer: usize, timeout: Duration) -> Result<()> {
        self.rt.wait_release_room(peer, timeout)
    }

    fn flush_releases(&self, timeout: Duration) -> Result<()> {
        self.rt.flush_releases(timeout)
    }

    fn semaphores(&self) -> &SemaphoreSlab {
        &self.slab
    }

    fn live_mappings(&self) -> usize {
        self.imports.live()
    }

    fn contiguous_view(&self, members: &[ViewMember<'_>]) -> Result<ContiguousView> {
        super::view::map(members, self.device)
    }
}

#[cfg(test)]
mod tests;
