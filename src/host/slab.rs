//! The host semaphore slab: one anonymous shared file per transport, passed to peers by fd
//! (see `transport::slab`).

use super::{fd_handle, fd_id};
use crate::error::Result;
use crate::fdpass::{FdId, FdPass};
use crate::os::memfd::{self, SharedMapping};
use crate::transport::slab::{PeerSlab, SemaphoreSlab, SlabMemory};
use crate::transport::{ExportedHandle, PeerMapping, SLAB_BYTES};
use once_cell::sync::OnceCell;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The memory of a host slab, offered to peers on its first export.
struct HostSlabMemory {
    mem: SharedMapping,
    fdpass: Arc<FdPass>,
    /// The slab's id with the fd transport, once offered (on the first export).
    offered: OnceCell<FdId>,
}

/// This process's slab for `job_tag`, shared through `fdpass`.
pub fn new_slab(job_tag: &str, fdpass: Arc<FdPass>) -> Result<SemaphoreSlab> {
    let mem = memfd::create_mapped(&crate::names::host_slab(job_tag), SLAB_BYTES)
        .map_err(|e| e.context("creating the host semaphore slab"))?;
    Ok(SemaphoreSlab::new(HostSlabMemory {
        mem,
        fdpass,
        offered: OnceCell::new(),
    }))
}

impl Drop for HostSlabMemory {
    fn drop(&mut self) {
        // The fd transport may outlive this slab (other caches of the job share it).
        if let Some(id) = self.offered.get() {
            self.fdpass.unregister(id);
        }
    }
}

impl SlabMemory for HostSlabMemory {
    fn base(&self) -> Result<u64> {
        Ok(self.mem.addr())
    }

    fn zero(&self, addr: u64) -> Result<()> {
        // SAFETY: `addr` is a slot of this mapping, which lives as long as `self`, and 4-byte
        // aligned (page-aligned base plus a multiple of the stride).
        unsafe { &*(addr as *const AtomicU32) }.store(0, Ordering::Release);
        Ok(())
    }

    fn export(&self) -> Result<ExportedHandle> {
        let id = self.offered.get_or_try_init(|| {
            self.fdpass
                .register_dup(self.mem.fd())
                .map_err(|e| e.context("offering the host semaphore slab to peers"))
        })?;
        Ok(fd_handle(id))
    }

    fn open_peer(&self, peer: usize, handle: &ExportedHandle, wait: Duration) -> Result<PeerSlab> {
        let what = format!("the semaphore slab of rank {peer}");
        let id = fd_id(handle.handle_type, &handle.payload, &what)?;
        let fd = self
            .fdpass
            .fetch(peer, &id, wait)
            .map_err(|e| e.context(format!("opening {what} (has its process exited?)")))?;
        crate::fdpass::vouch::file_owner(fd.as_fd(), self.fdpass.trusted(), &what)?;
        let mem = SharedMapping::map_peer(fd, SLAB_BYTES, &what)?;
        Ok(PeerMapping::new(peer, mem.addr(), SLAB_BYTES, 0, mem))
    }
}

#[cfg(test)]
mod tests;
