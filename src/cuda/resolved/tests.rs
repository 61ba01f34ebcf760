use super::*;
use crate::cuda::vmm::tests::seg;
use crate::test_rng::Rng;
use std::cell::Cell;
use std::collections::HashMap;

fn buffer(ptr: u64, bytes: u64, id: u64) -> LocalBuffer {
    LocalBuffer {
        ptr,
        bytes,
        base: ptr,
        alloc_bytes: bytes,
        buffer_id: id,
        device_uuid: [0; 16],
    }
}

const EXACT: Resolution = Resolution::Exact;

#[test]
fn a_remembered_buffer_is_served_while_the_driver_vouches_for_it() {
    let memo = Resolved::default();
    assert_eq!(memo.get((0x1000, 64, EXACT), |_, _| true), None);
    memo.remember(
        (0x1000, 64, EXACT),
        buffer(0x1000, 64, 7),
        Proof::Allocation,
    );
    let asked = Cell::new(0);
    let vouch = |b: &LocalBuffer, p: &Proof| {
        asked.set(asked.get() + 1);
        b.buffer_id == 7 && *p == Proof::Allocation
    };
    assert_eq!(
        memo.get((0x1000, 64, EXACT), vouch),
        Some(buffer(0x1000, 64, 7))
    );
    // Another byte count or resolution is another buffer.
    assert_eq!(memo.get((0x1000, 32, EXACT), vouch), None);
    assert_eq!(memo.get((0x1000, 64, Resolution::Shared), vouch), None);
    assert_eq!(asked.get(), 1, "only the entry of the same key is checked");
}

#[test]
fn an_entry_the_driver_no_longer_vouches_for_is_forgotten() {
    let memo = Resolved::default();
    let segments = Proof::Segments(vec![seg(0x20_0000, 5), seg(0x40_0000, 6)]);
    memo.remember((0x20_0000, 100, EXACT), buffer(0x20_0000, 100, 9), segments);
    assert_eq!(memo.get((0x20_0000, 100, EXACT), |_, _| false), None);
    assert_eq!(memo.count(), 0);
    let asked = Cell::new(false);
    let vouch = |_: &LocalBuffer, _: &Proof| {
        asked.set(true);
        true
    };
    assert_eq!(memo.get((0x20_0000, 100, EXACT), vouch), None);
    assert!(!asked.get(), "a forgotten entry is not checked again");
}

#[test]
fn remembering_again_replaces_and_the_oldest_goes_first() {
    let memo = Resolved::default();
    memo.remember((0x1000, 8, EXACT), buffer(0x1000, 8, 1), Proof::Allocation);
    memo.remember((0x1000, 8, EXACT), buffer(0x1000, 8, 2), Proof::Allocation);
    assert_eq!(memo.count(), 1);
    assert_eq!(
        memo.get((0x1000, 8, EXACT), |_, _| true)
            .map(|b| b.buffer_id),
        Some(2)
    );
    for i in 1..=CAPACITY as u64 {
        memo.remember(
            (0x1000 + i, 8, EXACT),
            buffer(0x1000 + i, 8, 100 + i),
            Proof::Allocation,
        );
    }
    assert_eq!(memo.count(), CAPACITY);
    // The first entry (0x1000) was the oldest when the last came.
    assert_eq!(memo.get((0x1000, 8, EXACT), |_, _| true), None);
    let last = 0x1000 + CAPACITY as u64;
    assert!(memo.get((last, 8, EXACT), |_, _| true).is_some());
}

/// Random programs against a model driver: buffers at a few addresses are freed and allocated
/// again (a new id each time), looked up, and remembered after a fresh resolve. A lookup never
/// returns a buffer the driver would not resolve the same way now, the memo never holds more
/// than its capacity, and a buffer just remembered and unchanged is served.
#[test]
fn random_programs_never_serve_a_stale_buffer() {
    for seed in 1..=200u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let memo = Resolved::default();
        // The driver: the id of the allocation at each address.
        let mut driver: HashMap<u64, u64> = HashMap::new();
        let mut next_id = 1;
        let addresses = 8 + rng.below(CAPACITY * 2);
        for step in 0..2_000 {
            let ptr = 0x10_0000 * (1 + rng.below(addresses) as u64);
            let bytes = [64, 4096][rng.below(2)];
            let key = (ptr, bytes, [EXACT, Resolution::Shared][rng.below(2)]);
            let ctx = format!("seed {seed} step {step}");
            match rng.below(4) {
                0 => {
                    // Freed, and maybe allocated again at the same address.
                    if rng.below(2) == 0 {
                        driver.remove(&ptr);
                    } else {
                        next_id += 1;
                        driver.insert(ptr, next_id);
                    }
                }
                _ => {
                    let now = driver.get(&ptr).copied();
                    let vouch = |b: &LocalBuffer, _: &Proof| Some(b.buffer_id) == now;
                    match (memo.get(key, vouch), now) {
                        (Some(served), Some(id)) => assert_eq!(served.buffer_id, id, "{ctx}"),
                        (Some(served), None) => panic!("{ctx}: served {served:?} of freed memory"),
                        (None, Some(id)) => {
                            // A fresh resolve, remembered; served at once while unchanged.
                            memo.remember(key, buffer(ptr, bytes, id), Proof::Allocation);
                            let again = memo.get(key, vouch).map(|b| b.buffer_id);
                            assert_eq!(again, Some(id), "{ctx}");
                        }
                        (None, None) => {}
                    }
                }
            }
            assert!(memo.count() <= CAPACITY, "{ctx}");
        }
    }
}

#[test]
fn a_new_range_inside_a_remembered_allocation_is_carved_from_it() {
    let memo = Resolved::default();
    let allocation = LocalBuffer {
        alloc_bytes: 4096,
        device_uuid: [3; 16],
        ..buffer(0x1000, 64, 7)
    };
    memo.remember((0x1000, 64, EXACT), allocation, Proof::Allocation);
    let carved = memo.carve((0x1000, 4096, 7), 0x1100, 128).unwrap();
    assert_eq!((carved.ptr, carved.bytes), (0x1100, 128));
    assert_eq!(
        (carved.base, carved.alloc_bytes, carved.buffer_id),
        (0x1000, 4096, 7)
    );
    assert_eq!(carved.device_uuid, [3; 16]);
    // The whole allocation fits; a byte more, a range before it or an empty one does not.
    assert!(memo.carve((0x1000, 4096, 7), 0x1000, 4096).is_some());
    assert_eq!(memo.carve((0x1000, 4096, 7), 0x1100, 4096), None);
    assert_eq!(memo.carve((0x1100, 4096, 7), 0x1000, 16), None);
    assert_eq!(memo.carve((0x1000, 4096, 7), 0x1100, 0), None);
    assert_eq!(memo.carve((0x1000, 4096, 7), u64::MAX, 2), None);
    // Another allocation at the same place (a new id, or another size) is not this one.
    assert_eq!(memo.carve((0x1000, 4096, 8), 0x1100, 128), None);
    assert_eq!(memo.carve((0x1000, 8192, 7), 0x1100, 128), None);
}

#[test]
fn vmm_buffers_are_never_carved() {
    let memo = Resolved::default();
    let run = LocalBuffer {
        alloc_bytes: 0x20_0000,
        ..buffer(0x20_0000, 64, 5)
    };
    memo.remember(
        (0x20_0000, 64, EXACT),
        run,
        Proof::Segments(vec![seg(0x20_0000, 5)]),
    );
    assert_eq!(memo.carve((0x20_0000, 0x20_0000, 5), 0x20_0100, 64), None);
}
