use super::*;
use crate::transport::slab::SEMAPHORE_STRIDE;

#[test]
fn slot_addresses_are_strided() {
    assert_eq!(slot_address(0x1000, 0), 0x1000);
    assert_eq!(slot_address(0x1000, 3), 0x1000 + 3 * SEMAPHORE_STRIDE);
    assert_eq!(SLAB_BYTES, 256 * 1024);
}

#[test]
fn offset_is_from_base() {
    let b = LocalBuffer {
        ptr: 0x2040,
        bytes: 16,
        base: 0x2000,
        alloc_bytes: 4096,
        buffer_id: 1,
        device_uuid: [0; 16],
    };
    assert_eq!(b.offset(), 0x40);
}

impl SemaphoreSlab {
    pub(crate) fn live_peer_slabs(&self) -> usize {
        self.peers.live()
    }
}
