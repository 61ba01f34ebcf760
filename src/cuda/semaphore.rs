//! The device semaphore slab: one `cuMemAlloc` of [`SLAB_BYTES`], allocated on first use, zeroed
//! and synchronised *before* it is exported (legacy IPC, once), and opened once per peer.
//!
//! It is freed on drop, after a synchronize of its context. Peers map it, so its owner (the
//! handle cache) drops it only after its teardown has waited for every peer it exchanged with to
//! close its cache (or exit), and never when that wait times out.

use super::driver::{self, Context, ContextGuard};
use super::ipc::{self, HandleBytes, IpcImport};
use super::memory;
use super::result;
use crate::error::{Error, Result};
use crate::sync::lock;
use crate::transport::peer_maps::PeerMappings;
use crate::transport::record::HandleType;
use crate::transport::{
    check_slot, slot_address, ExportedHandle, SemaphoreSlab, SLAB_BYTES, SLAB_SLOTS,
};
use cudarc::driver::sys;
use std::sync::Mutex;
use std::time::Duration;

/// The device memory of an allocated slab.
struct Allocation {
    base: u64,
    context: Context,
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

struct State {
    alloc: Option<Allocation>,
    in_use: Vec<bool>,
}

/// A device semaphore slab (see the module docs).
pub struct DeviceSemaphoreSlab {
    device: Option<i32>,
    state: Mutex<State>,
    /// Peer slabs this slab's owner has imported, by (peer, handle).
    peers: PeerMappings<(usize, HandleBytes), IpcImport>,
}

impl DeviceSemaphoreSlab {
    /// A slab on `device`, or on the device current when it is first used (`None`).
    /// Nothing is allocated until the first call that needs device memory.
    pub fn new(device: Option<i32>) -> DeviceSemaphoreSlab {
        DeviceSemaphoreSlab {
            device,
            state: Mutex::new(State {
                alloc: None,
                in_use: vec![false; SLAB_SLOTS as usize],
            }),
            peers: PeerMappings::default(),
        }
    }

    fn allocated(state: &mut State, device: Option<i32>) -> Result<&mut Allocation> {
        if state.alloc.is_none() {
            state.alloc = Some(allocate(device)?);
        }
        Ok(state.alloc.as_mut().expect("allocated above"))
    }
}

fn allocate(device: Option<i32>) -> Result<Allocation> {
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
        release(&alloc);
        return Err(err);
    }
    Ok(alloc)
}

/// Frees a slab allocation after all work in its context has finished.
fn release(alloc: &Allocation) {
    ipc::forget_export(alloc.base);
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

impl SemaphoreSlab for DeviceSemaphoreSlab {
    fn allocate_slot(&self) -> Result<u32> {
        let mut state = lock(&self.state);
        Self::allocated(&mut state, self.device)?;
        let slot = state.in_use.iter().position(|used| !used).ok_or_else(|| {
            Error::state(format!(
                "device semaphore slab is full: all {SLAB_SLOTS} slots are in use; release \
                 cached channels (clear the handle cache) before creating more"
            ))
        })?;
        state.in_use[slot] = true;
        Ok(slot as u32)
    }

    fn free_slot(&self, slot: u32) -> Result<()> {
        check_slot(slot)?;
        let mut state = lock(&self.state);
        if !state.in_use[slot as usize] {
            return Err(Error::state(format!(
                "semaphore slot {slot} is not allocated (freed twice?)"
            )));
        }
        let alloc = Self::allocated(&mut state, self.device)?;
        alloc.zero(slot_address(alloc.base, slot), 1)?;
        state.in_use[slot as usize] = false;
        Ok(())
    }

    fn local(&self, slot: u32) -> Result<u64> {
        check_slot(slot)?;
        let mut state = lock(&self.state);
        let alloc = Self::allocated(&mut state, self.device)?;
        Ok(slot_address(alloc.base, slot))
    }

    fn export(&self) -> Result<ExportedHandle> {
        let mut state = lock(&self.state);
        let alloc = Self::allocated(&mut state, self.device)?;
        let handle = match alloc.handle {
            Some(handle) => handle,
            None => {
                let buffer_id = memory::query(alloc.base)?.buffer_id;
                let handle = ipc::export(alloc.base, buffer_id)?;
                alloc.handle = Some(handle);
                handle
            }
        };
        Ok(ExportedHandle::plain(HandleType::CudaLegacyIpc, handle))
    }

    fn import_peer(&self, peer: usize, handle: &ExportedHandle, wait: Duration) -> Result<u64> {
        if handle.handle_type != HandleType::CudaLegacyIpc {
            return Err(Error::invalid(format!(
                "semaphore slab of rank {peer} is shared as {}, but this is the device slab",
                handle.handle_type.name()
            )));
        }
        let device = Self::allocated(&mut lock(&self.state), self.device)?.device;
        self.peers.acquire((peer, handle.payload), || {
            let opened = ipc::import(peer, None, &handle.payload, Some(device), wait)
                .map_err(|e| e.context(format!("opening the semaphore slab of rank {peer}")))?;
            let base = opened.base();
            Ok((opened, base))
        })
    }

    fn release_peer(&self, peer: usize, handle: &ExportedHandle) -> Result<()> {
        let key = (peer, handle.payload);
        match self.peers.release_matching(|k, _| *k == key) {
            None => Err(Error::not_found(format!(
                "the semaphore slab of rank {peer} is not imported (released twice?)"
            ))),
            Some(last) => last.map_or(Ok(()), IpcImport::release),
        }
    }
}

impl Drop for DeviceSemaphoreSlab {
    fn drop(&mut self) {
        // Peer slabs still imported through this slab are released first (the releaser closes
        // them), then our own slab is freed after a synchronize.
        drop(std::mem::take(&mut self.peers));
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(alloc) = state.alloc.take() {
            release(&alloc);
        }
    }
}

#[cfg(test)]
mod tests;
