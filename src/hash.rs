//! The crate's two hashes: [`fnv1a64`], 64-bit FNV-1a, for names and fingerprints every process
//! computes alike (so it never changes); [`FastMap`], rustc-hash's FxHasher for hot maps of short
//! keys, as the store server's key maps in `nvfipc-store` (SipHash's DoS resistance is not worth
//! its cost; docs/BENCHMARKS.md).

const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

pub(crate) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// FNV-1a fed in pieces.
#[derive(Clone, Copy)]
pub(crate) struct Fnv1a(u64);

impl Fnv1a {
    pub(crate) const fn new() -> Fnv1a {
        Fnv1a(OFFSET)
    }

    #[inline]
    pub(crate) fn write_byte(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(PRIME);
    }

    #[inline]
    pub(crate) fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_byte(b);
        }
    }

    pub(crate) fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a of `bytes`.
pub(crate) fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a::new();
    h.write(bytes);
    h.finish()
}

#[cfg(test)]
mod tests;
