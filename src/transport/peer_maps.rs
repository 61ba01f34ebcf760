//! Peer memory mapped in this process, owned by guards: a [`PeerMapping`] is one reference to a
//! mapping of a peer's allocation (or semaphore slab); clones are more references, and the last
//! one dropped unmaps it (the device transport hands it to its releaser thread, never waiting).
//! [`PeerMaps`] keeps one mapping per key through weak references, so the guards alone count.

use crate::sync::lock;
use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, Weak};

/// One mapping of a peer's memory, shared by its guards; its `memory` unmaps on drop.
struct Mapped {
    peer: usize,
    base: u64,
    alloc_bytes: u64,
    buffer_id: u64,
    memory: Box<dyn Any + Send + Sync>,
}

/// One reference to a peer allocation mapped here (see the module docs).
#[derive(Clone)]
pub struct PeerMapping {
    mapped: Arc<Mapped>,
    ptr: u64,
}

impl PeerMapping {
    /// The guard of `memory`, which a transport opened: rank `peer`'s allocation `buffer_id`
    /// (0 for a semaphore slab) of `alloc_bytes`, mapped at `base`; dropping `memory` unmaps it.
    pub fn new(
        peer: usize,
        base: u64,
        alloc_bytes: u64,
        buffer_id: u64,
        memory: impl Any + Send + Sync,
    ) -> PeerMapping {
        let mapped = Mapped {
            peer,
            base,
            alloc_bytes,
            buffer_id,
            memory: Box::new(memory),
        };
        PeerMapping {
            mapped: Arc::new(mapped),
            ptr: base,
        }
    }

    /// Another reference to the same mapping, pointing `offset` bytes into it.
    pub fn at(&self, offset: u64) -> PeerMapping {
        PeerMapping {
            mapped: Arc::clone(&self.mapped),
            ptr: self.mapped.base + offset,
        }
    }

    /// The peer's buffer as seen from here.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Where the peer's whole allocation is mapped in this process.
    pub fn base(&self) -> u64 {
        self.mapped.base
    }

    /// Size of the mapped allocation.
    pub fn alloc_bytes(&self) -> u64 {
        self.mapped.alloc_bytes
    }

    /// The exporting rank.
    pub fn peer(&self) -> usize {
        self.mapped.peer
    }

    /// The exporter's allocation id (from its record).
    pub fn buffer_id(&self) -> u64 {
        self.mapped.buffer_id
    }

    /// What the transport that opened the mapping keeps of it, if it is a `T`.
    pub fn memory<T: Any>(&self) -> Option<&T> {
        self.mapped.memory.downcast_ref()
    }
}

impl PartialEq for PeerMapping {
    /// The same mapping, at the same place in it.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.mapped, &other.mapped) && self.ptr == other.ptr
    }
}

impl Eq for PeerMapping {}

impl fmt::Debug for PeerMapping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.mapped;
        let (peer, id, base) = (m.peer, m.buffer_id, m.base);
        write!(
            f,
            "PeerMapping(rank {peer} allocation {id} at {base:#x}, ptr {:#x})",
            self.ptr
        )
    }
}

/// The live mappings of a transport by key, held weakly: one mapping per key while any guard of
/// it lives.
pub struct PeerMaps<K> {
    live: Mutex<HashMap<K, Weak<Mapped>>>,
}

impl<K> Default for PeerMaps<K> {
    fn default() -> Self {
        PeerMaps {
            live: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash> PeerMaps<K> {
    /// A new reference to the live mapping of `key`, `offset` bytes into it.
    pub fn get(&self, key: &K, offset: u64) -> Option<PeerMapping> {
        let mapped = lock(&self.live).get(key)?.upgrade()?;
        let ptr = mapped.base + offset;
        Some(PeerMapping { mapped, ptr })
    }

    /// Makes `opened` the mapping of `key`, unless another thread mapped it meanwhile: then
    /// `opened` is dropped (unmapped) and the live one is returned at `opened`'s offset.
    pub fn insert(&self, key: K, opened: PeerMapping) -> PeerMapping {
        let mut live = lock(&self.live);
        if let Some(mapped) = live.get(&key).and_then(Weak::upgrade) {
            let ptr = mapped.base + (opened.ptr - opened.base());
            return PeerMapping { mapped, ptr };
        }
        // Mappings whose guards are all gone leave their keys behind until here.
        live.retain(|_, m| m.strong_count() > 0);
        live.insert(key, Arc::downgrade(&opened.mapped));
        opened
    }

    /// Number of mappings alive (each counted once, whatever its guards).
    pub fn live(&self) -> usize {
        lock(&self.live)
            .values()
            .filter(|m| m.strong_count() > 0)
            .count()
    }
}

#[cfg(test)]
mod tests;
