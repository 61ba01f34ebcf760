//! The host semaphore slab: [`SLAB_SLOTS`] 32-bit semaphores in one shared-memory segment per
//! transport, so a peer maps one segment per rank whatever the number of channels.

use super::alloc::job_prefix;
use crate::error::{Error, Result};
use crate::os::shm::ShmSegment;
use crate::transport::record::{from_fixed, to_fixed, HandleType, PAYLOAD_LEN};
use crate::transport::{slot_address, ExportedHandle, SemaphoreSlab, SLAB_BYTES, SLAB_SLOTS};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

static NEXT_SLAB: AtomicU64 = AtomicU64::new(1);

struct PeerSlab {
    seg: ShmSegment,
    refs: usize,
}

/// A semaphore slab in host shared memory, unlinked when dropped.
pub struct HostSlab {
    seg: ShmSegment,
    handle: ExportedHandle,
    free: Mutex<Vec<u32>>,
    peers: Mutex<HashMap<(usize, [u8; PAYLOAD_LEN]), PeerSlab>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl HostSlab {
    /// Creates this process's slab for `job_id`.
    pub fn new(job_id: &str) -> Result<HostSlab> {
        let name = format!(
            "/{}{}-s{}",
            job_prefix(job_id),
            crate::os::cleanup::pid_field(),
            NEXT_SLAB.fetch_add(1, Ordering::Relaxed)
        );
        let seg = ShmSegment::create(&name, SLAB_BYTES)
            .map_err(|e| e.context("creating the host semaphore slab"))?;
        let handle = ExportedHandle {
            handle_type: HandleType::PosixShm,
            payload: to_fixed(&name)?,
        };
        Ok(HostSlab {
            seg,
            handle,
            // Pop from the end: slot 0 first.
            free: Mutex::new((0..SLAB_SLOTS).rev().collect()),
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// Number of peer slabs currently mapped.
    pub fn live_peer_slabs(&self) -> usize {
        lock(&self.peers).len()
    }

    fn semaphore(&self, slot: u32) -> Result<&AtomicU32> {
        let addr = self.local(slot)?;
        // SAFETY: `addr` is 4-byte aligned (page-aligned base plus a multiple of the stride) and
        // inside our mapping, which lives as long as `self`.
        Ok(unsafe { &*(addr as *const AtomicU32) })
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
        if slot >= SLAB_SLOTS {
            return Err(Error::invalid(format!(
                "semaphore slot {slot} is out of range (slab has {SLAB_SLOTS})"
            )));
        }
        Ok(slot_address(self.seg.addr(), slot))
    }

    fn export(&self) -> Result<ExportedHandle> {
        Ok(self.handle)
    }

    fn import_peer(&self, peer: usize, handle: &ExportedHandle, _wait: Duration) -> Result<u64> {
        if handle.handle_type != HandleType::PosixShm {
            return Err(Error::protocol(format!(
                "rank {peer} sent a {} semaphore slab for host memory",
                handle.handle_type.name()
            )));
        }
        let mut peers = lock(&self.peers);
        if let Some(p) = peers.get_mut(&(peer, handle.payload)) {
            p.refs += 1;
            return Ok(p.seg.addr());
        }
        let name = from_fixed(&handle.payload);
        let seg = ShmSegment::open(&name, SLAB_BYTES)?.ok_or_else(|| {
            Error::not_found(format!(
                "semaphore slab {name} of rank {peer} does not exist (its process exited?)"
            ))
        })?;
        let addr = seg.addr();
        peers.insert((peer, handle.payload), PeerSlab { seg, refs: 1 });
        Ok(addr)
    }

    fn release_peer(&self, peer: usize, handle: &ExportedHandle) -> Result<()> {
        let mut peers = lock(&self.peers);
        let key = (peer, handle.payload);
        let Some(p) = peers.get_mut(&key) else {
            return Err(Error::state(format!(
                "semaphore slab {} of rank {peer} is not mapped (released twice?)",
                from_fixed(&handle.payload)
            )));
        };
        p.refs -= 1;
        if p.refs == 0 {
            peers.remove(&key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_shared_with_an_importer() {
        let a = HostSlab::new("unit_slab").unwrap();
        let b = HostSlab::new("unit_slab").unwrap();
        let slot = a.allocate_slot().unwrap();
        assert_eq!(slot, 0);
        let handle = a.export().unwrap();
        let base = b.import_peer(1, &handle, Duration::ZERO).unwrap();
        assert_eq!(
            b.import_peer(1, &handle, Duration::ZERO).unwrap(),
            base,
            "deduplicated"
        );
        assert_eq!(b.live_peer_slabs(), 1);
        // SAFETY: `base` maps a's slab; slot 0 is inside it and 4-byte aligned.
        let remote = unsafe { &*(slot_address(base, slot) as *const AtomicU32) };
        remote.store(5, Ordering::Release);
        assert_eq!(a.semaphore(slot).unwrap().load(Ordering::Acquire), 5);
        a.free_slot(slot).unwrap();
        assert_eq!(remote.load(Ordering::Acquire), 0, "freed slots are reset");
        b.release_peer(1, &handle).unwrap();
        assert_eq!(b.live_peer_slabs(), 1);
        b.release_peer(1, &handle).unwrap();
        assert_eq!(b.live_peer_slabs(), 0);
        assert!(b.release_peer(1, &handle).is_err());
        assert!(a.local(SLAB_SLOTS).is_err());
    }
}
