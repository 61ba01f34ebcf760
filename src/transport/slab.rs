//! The semaphore slab: [`SLAB_SLOTS`] 32-bit semaphores in one block of memory per transport,
//! exported once, so a peer opens one slab per rank whatever the number of channels. Semaphores
//! start at zero and hold epoch values (see [`epoch`](super::epoch)).
//!
//! [`SemaphoreSlab`] keeps the slots, and maps each peer's slab once while a guard of it lives,
//! once for both backends; the memory is a backend's [`SlabMemory`]: host shared memory in
//! `host::slab`, device memory in `cuda::semaphore`.

use super::peer_maps::{PeerMapping, PeerMaps};
use super::record::{NO_SLOT, PAYLOAD_LEN};
use super::ExportedHandle;
use crate::error::{Error, Result};
use crate::sync::lock;
use std::sync::Mutex;
use std::time::Duration;

/// Distance in bytes between two semaphore slots of a slab: a 32-bit semaphore, then padding to
/// a cache line.
pub const SEMAPHORE_STRIDE: u64 = 64;
/// Number of semaphore slots in one slab; also the number of channels a rank's board can publish
/// (one semaphore for each).
pub const SLAB_SLOTS: u32 = 4096;
/// Size of a semaphore slab in bytes.
pub const SLAB_BYTES: u64 = SEMAPHORE_STRIDE * SLAB_SLOTS as u64;

/// Address of `slot` in a slab mapped at `base`.
pub fn slot_address(base: u64, slot: u32) -> u64 {
    base + u64::from(slot) * SEMAPHORE_STRIDE
}

/// `InvalidArgument` unless `slot` is a slot of a slab.
pub fn check_slot(slot: u32) -> Result<()> {
    if slot >= SLAB_SLOTS {
        return Err(Error::invalid(format!(
            "semaphore slot {slot} is out of range (the slab has {SLAB_SLOTS} slots)"
        )));
    }
    Ok(())
}

/// The memory of a slab, as a backend provides it.
pub trait SlabMemory: Send + Sync {
    /// Base of the slab in this process (allocated on first use where that is costly).
    fn base(&self) -> Result<u64>;

    /// Resets the semaphore at `addr` (in this slab) to zero, visibly to peers on return.
    fn zero(&self, addr: u64) -> Result<()>;

    /// The slab's handle (made once, then cached).
    fn export(&self) -> Result<ExportedHandle>;

    /// Opens the slab of rank `peer`: its guard, which may outlive this memory.
    fn open_peer(&self, peer: usize, handle: &ExportedHandle, wait: Duration) -> Result<PeerSlab>;
}

/// The guard of a peer's slab mapped here (its buffer id is 0).
pub type PeerSlab = PeerMapping;

/// A per-process slab over a backend's memory, and the peers' slabs mapped here.
pub struct SemaphoreSlab {
    pub(super) peers: PeerMaps<(usize, [u8; PAYLOAD_LEN])>,
    in_use: Mutex<Vec<bool>>,
    mem: Box<dyn SlabMemory>,
}

impl SemaphoreSlab {
    pub fn new(mem: impl SlabMemory + 'static) -> SemaphoreSlab {
        SemaphoreSlab {
            peers: PeerMaps::default(),
            in_use: Mutex::new(vec![false; SLAB_SLOTS as usize]),
            mem: Box::new(mem),
        }
    }

    /// Reserves a free slot (its semaphore reads zero); `InvalidState` when all are in use.
    pub fn allocate_slot(&self) -> Result<u32> {
        self.mem.base()?;
        let mut in_use = lock(&self.in_use);
        let slot = in_use.iter().position(|used| !used).ok_or_else(|| {
            Error::state(format!(
                "the semaphore slab is full: all {SLAB_SLOTS} slots are in use; release cached \
                 channels (drop unused caches) before creating more"
            ))
        })?;
        in_use[slot] = true;
        Ok(slot as u32)
    }

    /// Returns a slot to the free ones, its semaphore reset to zero.
    pub fn free_slot(&self, slot: u32) -> Result<()> {
        check_slot(slot)?;
        let mut in_use = lock(&self.in_use);
        if !in_use[slot as usize] {
            return Err(Error::state(format!(
                "semaphore slot {slot} is not allocated (freed twice?)"
            )));
        }
        self.mem.zero(slot_address(self.mem.base()?, slot))?;
        in_use[slot as usize] = false;
        Ok(())
    }

    /// Address of `slot` in this process (a device address for device slabs; 0 for `NO_SLOT`).
    pub fn local(&self, slot: u32) -> Result<u64> {
        if slot == NO_SLOT {
            return Ok(0);
        }
        check_slot(slot)?;
        Ok(slot_address(self.mem.base()?, slot))
    }

    /// The slab's handle (exported once, then cached).
    pub fn export(&self) -> Result<ExportedHandle> {
        self.mem.export()
    }

    /// Maps the slab of rank `peer` once per (peer, handle) while a guard of it lives.
    pub fn import_peer(
        &self,
        peer: usize,
        handle: &ExportedHandle,
        wait: Duration,
    ) -> Result<PeerSlab> {
        let key = (peer, handle.payload);
        if let Some(mapped) = self.peers.get(&key, 0) {
            return Ok(mapped);
        }
        let opened = self.mem.open_peer(peer, handle, wait)?;
        Ok(self.peers.insert(key, opened))
    }
}
