//! A small, fast, non-cryptographic hasher for the store's key maps (the Fx algorithm used by
//! rustc, with a final mix). Keys are short byte strings from cluster peers; SipHash's DoS resistance is not
//! worth its cost for a store that has no authentication anyway.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

#[derive(Default, Clone, Copy)]
pub(crate) struct FxHasher {
    hash: u64,
}

impl FxHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    /// Mixes every input bit into the low bits, which pick the bucket: without this, keys that
    /// differ only in the high bytes of their last word (`.../arrived/0/131071` and its
    /// neighbours) share buckets and a map of them degrades to linear scans.
    #[inline]
    fn finish(&self) -> u64 {
        let mut h = self.hash;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }
}

pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hash;

    fn hash_of(bytes: &[u8]) -> u64 {
        let mut h = FxHasher::default();
        bytes.hash(&mut h);
        h.finish()
    }

    #[test]
    fn keys_differing_only_at_their_end_spread_over_the_low_bits() {
        // hashbrown picks the bucket from the low bits: barrier keys of a large world must not
        // pile up in a few buckets.
        let mut buckets = std::collections::HashSet::new();
        for rank in 0..4096 {
            let key = format!("/nvfipc/barrier/0123456789abcdef/w131072/arrived/0/{rank}");
            buckets.insert(hash_of(key.as_bytes()) & 0xfff);
        }
        assert!(
            buckets.len() > 2048,
            "{} buckets of 4096 used",
            buckets.len()
        );
    }

    #[test]
    fn distinct_keys_hash_differently_and_maps_work() {
        assert_ne!(hash_of(b"/a"), hash_of(b"/b"));
        assert_ne!(hash_of(b"abcdefgh1"), hash_of(b"abcdefgh2"));
        // Length is hashed too, so zero padding does not collide.
        assert_ne!(hash_of(b"a"), hash_of(b"a\0"));
        let mut m: FastMap<Vec<u8>, u32> = FastMap::default();
        for i in 0..1000u32 {
            m.insert(format!("/key{i}").into_bytes(), i);
        }
        assert_eq!(m.get(&b"/key777"[..]), Some(&777));
        assert_eq!(m.len(), 1000);
    }
}
