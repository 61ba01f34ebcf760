//! Peer memory mapped in this process, refcounted by key: one open per key however often it is
//! imported, closed (by dropping what was opened) when the last reference goes. The host
//! transport keeps its peers' buffers and slabs in one each, the device slab its peers' slabs.

use crate::error::Result;
use crate::sync::lock;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

struct Held<M> {
    mem: M,
    addr: u64,
    refs: usize,
}

pub struct PeerMappings<K, M> {
    held: Mutex<HashMap<K, Held<M>>>,
}

impl<K, M> Default for PeerMappings<K, M> {
    fn default() -> Self {
        PeerMappings {
            held: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Copy, M> PeerMappings<K, M> {
    /// Takes a reference to the mapping of `key` and returns its address, calling `open` when it
    /// is not mapped yet (without the table's lock: other keys must not wait for a peer).
    pub fn acquire(&self, key: K, open: impl FnOnce() -> Result<(M, u64)>) -> Result<u64> {
        if let Some(h) = lock(&self.held).get_mut(&key) {
            h.refs += 1;
            return Ok(h.addr);
        }
        let (mem, addr) = open()?;
        // Another thread may have mapped it meanwhile: then ours is dropped (closed).
        let mut held = lock(&self.held);
        let h = held.entry(key).or_insert(Held { mem, addr, refs: 0 });
        h.refs += 1;
        Ok(h.addr)
    }

    /// Drops one reference of the first mapping whose key and address `matches`: `None` when
    /// none matches (released twice?), else the mapping if that was its last reference, for the
    /// caller to close outside the table's lock.
    pub fn release_matching(&self, matches: impl Fn(&K, u64) -> bool) -> Option<Option<M>> {
        let mut held = lock(&self.held);
        let key = *held.iter().find(|(k, h)| matches(k, h.addr))?.0;
        let h = held.get_mut(&key).expect("key found above");
        h.refs -= 1;
        Some((h.refs == 0).then(|| held.remove(&key).expect("key found above").mem))
    }

    /// `f` of the mapping of `key`; `None` when it is not mapped.
    pub fn with<R>(&self, key: &K, f: impl FnOnce(&M) -> R) -> Option<R> {
        lock(&self.held).get(key).map(|h| f(&h.mem))
    }

    /// Number of mappings held (each counted once, whatever its references).
    pub fn len(&self) -> usize {
        lock(&self.held).len()
    }
}
