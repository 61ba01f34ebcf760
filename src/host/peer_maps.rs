//! Peer files mapped in this process, refcounted by key: one fetch and one mapping per key
//! however often it is imported, unmapped when the last reference goes. The host transport keeps
//! its peers' buffers in one, its slab the peers' slabs in another.

use crate::error::Result;
use crate::os::memfd::SharedMapping;
use crate::sync::lock;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;

struct Held {
    mem: SharedMapping,
    refs: usize,
}

pub struct PeerMappings<K> {
    held: Mutex<HashMap<K, Held>>,
}

impl<K> Default for PeerMappings<K> {
    fn default() -> Self {
        PeerMappings {
            held: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Copy> PeerMappings<K> {
    /// Takes a reference to the mapping of `key` and returns its address, calling `open` to
    /// fetch and map it when it is not mapped yet. `open` runs without the table's lock: a
    /// peer's answer may take a while, and other keys must not wait for it.
    pub fn acquire(&self, key: K, open: impl FnOnce() -> Result<SharedMapping>) -> Result<u64> {
        if let Some(h) = lock(&self.held).get_mut(&key) {
            h.refs += 1;
            return Ok(h.mem.addr());
        }
        let mem = open()?;
        // Another thread may have mapped it meanwhile: then ours is dropped (unmapped).
        let mut held = lock(&self.held);
        let h = held.entry(key).or_insert(Held { mem, refs: 0 });
        h.refs += 1;
        Ok(h.mem.addr())
    }

    /// Drops one reference of the first mapping whose key and address `matches`; unmaps at zero.
    /// False when none matches (released twice?).
    pub fn release_matching(&self, matches: impl Fn(&K, u64) -> bool) -> bool {
        let mut held = lock(&self.held);
        let Some(key) = held
            .iter()
            .find(|(k, h)| matches(k, h.mem.addr()))
            .map(|(k, _)| *k)
        else {
            return false;
        };
        let h = held.get_mut(&key).expect("key found above");
        h.refs -= 1;
        if h.refs == 0 {
            held.remove(&key);
        }
        true
    }

    /// A descriptor of the file mapped for `key` (a duplicate, so the file can be mapped again
    /// elsewhere); `None` when it is not mapped.
    pub fn fd_of(&self, key: &K) -> Option<std::io::Result<std::os::fd::OwnedFd>> {
        lock(&self.held)
            .get(key)
            .map(|h| h.mem.fd().try_clone_to_owned())
    }

    /// Number of mappings held (each counted once, whatever its references).
    pub fn len(&self) -> usize {
        lock(&self.held).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
