//! The device semaphore slab: one `cuMemAlloc` of [`SLAB_BYTES`], allocated on first use, zeroed
//! and synchronised *before* it is exported (legacy IPC, once), and opened once per peer.
//!
//! It is freed on drop, after a synchronize of its context. Peers map it, so its owner (the
//! handle cache) drops it only after its teardown has waited for every peer it exchanged with to
//! close its cache (or exit), and never when that wait times out.

use super::driver::{self, ContextGuard, CudaContext};
use super::ipc::{self, HandleBytes};
use super::memory;
use super::{result, Runtime};
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::transport::record::HandleType;
use crate::transport::slab::{PeerSlab, SemaphoreSlab, SlabMemory};
use crate::transport::{ExportedHandle, PeerMapping, SLAB_BYTES};
use cudarc::driver::sys;
use std::sync::Mutex;
use std::time::Duration;

/// The device memory of an allocated slab.
struct Allocation {
    base: u64,
    context: CudaContext,
    device: i32,
    /// A private non-blocking stream for zeroing slots without waiting on the user's work.
    stream: usize,
    handle: Option<HandleBytes>,
}

impl Allocation {
    fn stream(&self) -> sys::CUstream {
        self.stream as sys::CUstream
    }

    /// Zeroes `words` 32-bit words at `addr` and waits until the zeros are in device memory.
    fn zero(&self, addr: u64, words: usize) -> Result<()> {
        let _guard = ContextGuard::enter(self.context)?;
        // SAFETY: `addr` lies inside this slab (callers pass the base or a slot address) and
        // `words` 4-byte words fit; the stream belongs to the slab's context.
        unsafe { result::memset_d32_async(addr, 0, words, self.stream()) }
            .map_err(|rc| driver::error(rc, "cuMemsetD32Async(semaphore slab)"))?;
        // SAFETY: a valid stream created by this slab.
        unsafe { result::stream_synchronize(self.stream()) }
            .map_err(|rc| driver::error(rc, "cuStreamSynchronize(semaphore slab)"))
    }
}

/// The memory of a device slab: allocated on first use, freed on drop.
struct DeviceSlabMemory {
    /// Where its export is registered and peers' slabs are imported.
    rt: &'static Runtime,
    device: Option<i32>,
    alloc: Mutex<Option<Allocation>>,
}

/// A slab on `device` (`None`: the device current at first use), allocated on first use.
pub fn new_slab(rt: &'static Runtime, device: Option<i32>) -> SemaphoreSlab {
    SemaphoreSlab::new(DeviceSlabMemory {
        rt,
        device,
        alloc: Mutex::new(None),
    })
}

impl DeviceSlabMemory {
    /// `f` of the allocation, made first if needed.
    fn with<R>(&self, f: impl FnOnce(&mut Allocation) -> Result<R>) -> Result<R> {
        let mut alloc = lock(&self.alloc);
        if alloc.is_none() {
            *alloc = Some(allocate(self.rt, self.device)?);
        }
        f(alloc.as_mut().expect("allocated above"))
    }
}

fn allocate(rt: &Runtime, device: Option<i32>) -> Result<Allocation> {
    driver::driver()?;
    let (context, _guard) = driver::enter_device(device)?;
    let device = context.device()?;
    let base = result::mem_alloc(SLAB_BYTES as usize).map_err(|rc| {
        driver::error(
            rc,
            &format!("cuMemAlloc({SLAB_BYTES} bytes for the semaphore slab on device {device})"),
        )
    })?;
    let stream = match result::stream_create(sys::CUstream_flags::CU_STREAM_NON_BLOCKING) {
        Ok(stream) => stream,
        Err(rc) => {
            // SAFETY: `base` was allocated above and never shared.
            let _ = unsafe { result::mem_free(base) };
            return Err(driver::error(rc, "cuStreamCreate(semaphore slab)"));
        }
    };
    let alloc = Allocation {
        base,
        context,
        device,
        stream: stream as usize,
        handle: None,
    };
    // Zero before anything can be exported: peers must never see garbage epochs.
    if let Err(err) = alloc.zero(base, (SLAB_BYTES / 4) as usize) {
        release(rt, &alloc);
        return Err(err);
    }
    Ok(alloc)
}

/// Frees a slab allocation after all work in its context has finished.
fn release(rt: &Runtime, alloc: &Allocation) {
    ipc::forget_export(rt, alloc.base);
    if let Ok(_guard) = ContextGuard::enter(alloc.context) {
        // Errors cannot be reported from teardown.
        let _ = result::ctx_synchronize();
        // SAFETY: the stream and the allocation belong to this slab and are released once, here,
        // after the synchronize above (so no queued operation still uses them).
        unsafe {
            let _ = result::stream_destroy(alloc.stream());
            let _ = result::mem_free(alloc.base);
        }
    }
}

impl SlabMemory for DeviceSlabMemory {
    fn base(&self) -> Result<u64> {
        self.with(|a| Ok(a.base))
    }

    fn zero(&self, addr: u64) -> Result<()> {
        self.with(|a| a.zero(addr, 1))
    }

    fn export(&self) -> Result<ExportedHandle> {
        self.with(|a| {
            let handle = match a.handle {
                Some(handle) => handle,
                None => *a.handle.insert(ipc::export(
                    self.rt,
                    a.base,
                    memory::query(a.base)?.buffer_id,
                )?),
            };
            Ok(ExportedHandle::plain(HandleType::CudaLegacyIpc, handle))
        })
    }

    fn open_peer(&self, peer: usize, handle: &ExportedHandle, wait: Duration) -> Result<PeerSlab> {
        if handle.handle_type != HandleType::CudaLegacyIpc {
            return Err(Error::invalid(format!(
                "semaphore slab of rank {peer} is shared as {}, but this is the device slab",
                handle.handle_type.name()
            )));
        }
        let device = self.with(|a| Ok(a.device))?;
        let opened = ipc::import(self.rt, peer, None, &handle.payload, Some(device), wait)
            .map_err(|e| e.context(format!("opening the semaphore slab of rank {peer}")))?;
        // The import table is the process's: the guard may outlive this slab.
        Ok(PeerMapping::new(peer, opened.base(), SLAB_BYTES, 0, opened))
    }
}

impl Drop for DeviceSlabMemory {
    fn drop(&mut self) {
        // Ours is freed after a synchronize (peers' slabs mapped here are their guards').
        if let Some(alloc) = self
            .alloc
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            release(self.rt, &alloc);
        }
    }
}

#[cfg(test)]
mod tests;
