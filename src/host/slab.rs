//! The host semaphore slab: [`SLAB_SLOTS`] 32-bit semaphores in one anonymous shared file per
//! transport, passed to peers by fd, so a peer maps one slab per rank whatever the number of
//! channels.

use super::{fd_handle, fd_id, with_addr};
use crate::error::{Error, Result};
use crate::fdpass::{FdId, FdPass};
use crate::os::memfd::{self, SharedMapping};
use crate::sync::lock;
use crate::transport::peer_maps::PeerMappings;
use crate::transport::record::PAYLOAD_LEN;
use crate::transport::{
    check_slot, slot_address, ExportedHandle, SemaphoreSlab, SLAB_BYTES, SLAB_SLOTS,
};
use once_cell::sync::OnceCell;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A semaphore slab in host shared memory, offered to peers on its first export.
pub struct HostSlab {
    mem: SharedMapping,
    fdpass: Arc<FdPass>,
    /// The slab's id with the fd transport, once offered (on the first export).
    offered: OnceCell<FdId>,
    free: Mutex<Vec<u32>>,
    peers: PeerMappings<(usize, [u8; PAYLOAD_LEN]), SharedMapping>,
}

impl HostSlab {
    /// Creates this process's slab for `job_tag`, shared through `fdpass`.
    pub fn new(job_tag: &str, fdpass: Arc<FdPass>) -> Result<HostSlab> {
        let mem = memfd::create_mapped(&format!("nvfipc-{job_tag}-slab"), SLAB_BYTES)
            .map_err(|e| e.context("creating the host semaphore slab"))?;
        Ok(HostSlab {
            mem,
            fdpass,
            offered: OnceCell::new(),
            // Pop from the end: slot 0 first.
            free: Mutex::new((0..SLAB_SLOTS).rev().collect()),
            peers: PeerMappings::default(),
        })
    }

    /// Number of peer slabs currently mapped.
    pub fn live_peer_slabs(&self) -> usize {
        self.peers.len()
    }

    fn semaphore(&self, slot: u32) -> Result<&AtomicU32> {
        let addr = self.local(slot)?;
        // SAFETY: `addr` is 4-byte aligned (page-aligned base plus a multiple of the stride) and
        // inside our mapping, which lives as long as `self`.
        Ok(unsafe { &*(addr as *const AtomicU32) })
    }
}

impl Drop for HostSlab {
    fn drop(&mut self) {
        // The fd transport may outlive this slab (other caches of the job share it).
        if let Some(id) = self.offered.get() {
            self.fdpass.unregister(id);
        }
    }
}

impl SemaphoreSlab for HostSlab {
    fn allocate_slot(&self) -> Result<u32> {
        lock(&self.free).pop().ok_or_else(|| {
            Error::state(format!(
                "all {SLAB_SLOTS} host semaphore slots are in use: too many channels in one \
                 cache (drop unused caches)"
            ))
        })
    }

    fn free_slot(&self, slot: u32) -> Result<()> {
        self.semaphore(slot)?.store(0, Ordering::Release);
        lock(&self.free).push(slot);
        Ok(())
    }

    fn local(&self, slot: u32) -> Result<u64> {
        check_slot(slot)?;
        Ok(slot_address(self.mem.addr(), slot))
    }

    fn export(&self) -> Result<ExportedHandle> {
        let id = self.offered.get_or_try_init(|| {
            self.fdpass
                .register_dup(self.mem.fd())
                .map_err(|e| e.context("offering the host semaphore slab to peers"))
        })?;
        Ok(fd_handle(id))
    }

    fn import_peer(&self, peer: usize, handle: &ExportedHandle, wait: Duration) -> Result<u64> {
        let what = format!("the semaphore slab of rank {peer}");
        let id = fd_id(handle.handle_type, &handle.payload, &what)?;
        self.peers.acquire((peer, handle.payload), || {
            let fd = self
                .fdpass
                .fetch(peer, &id, wait)
                .map_err(|e| e.context(format!("opening {what} (has its process exited?)")))?;
            SharedMapping::map(fd, SLAB_BYTES, &what).map(with_addr)
        })
    }

    fn release_peer(&self, peer: usize, handle: &ExportedHandle) -> Result<()> {
        let key = (peer, handle.payload);
        if self.peers.release_matching(|k, _| *k == key).is_none() {
            return Err(Error::state(format!(
                "the semaphore slab of rank {peer} is not mapped (released twice?)"
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
