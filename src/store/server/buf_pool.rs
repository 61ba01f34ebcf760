//! A small, bounded pool of large buffers shared by all connections.
//!
//! Connections keep small buffers while idle, so a thousand clients cost little memory. A large
//! value (up to 8 MiB) would otherwise mean a fresh allocation, page faults and zero-filling on
//! every request; instead the large buffers go back to this pool and the next large request
//! (from any connection) reuses one whose pages are already mapped.

/// Buffers at least this large are pooled instead of kept by an idle connection.
pub(crate) const LARGE: usize = 256 * 1024;
/// Total capacity the pool holds at most; buffers beyond it are freed.
const POOL_BYTES: usize = 64 << 20;

#[derive(Default)]
pub(crate) struct BufPool {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

impl BufPool {
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// Keeps `buf` (its length and initialized bytes included) if the pool has room.
    pub fn give(&mut self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap >= LARGE && self.bytes + cap <= POOL_BYTES {
            self.bytes += cap;
            self.bufs.push(buf);
        }
    }

    /// The smallest pooled buffer with at least `min_capacity`, if any.
    pub fn take(&mut self, min_capacity: usize) -> Option<Vec<u8>> {
        let best = self
            .bufs
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= min_capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        let buf = self.bufs.swap_remove(best);
        self.bytes -= buf.capacity();
        Some(buf)
    }
}

#[cfg(test)]
mod tests;
