use super::*;

fn m(peer: usize, buffer_id: u64, offset: u64) -> Mapping {
    Mapping {
        peer,
        base: 0x1000 * buffer_id,
        ptr: 0x1000 * buffer_id + offset,
        alloc_bytes: 0x1000,
        buffer_id,
    }
}

#[test]
fn keeps_distinct_allocations_up_to_the_bound_oldest_out() {
    let mut r = Retained::default();
    assert!(r.retire(MemKind::Device, m(1, 1, 0), 2).is_empty());
    assert!(r.retire(MemKind::Device, m(1, 2, 0), 2).is_empty());
    // Another buffer of a kept allocation: its reference goes back at once.
    assert_eq!(r.retire(MemKind::Device, m(1, 1, 64), 2), vec![m(1, 1, 64)]);
    assert_eq!(r.len(), 2);
    // A third allocation evicts the least recently replaced one (2: 1 was refreshed).
    assert_eq!(r.retire(MemKind::Device, m(1, 3, 0), 2), vec![m(1, 2, 0)]);
    assert!(r.holds(MemKind::Device, &m(1, 1, 128)));
    assert!(!r.holds(MemKind::Device, &m(1, 2, 0)));
    assert!(!r.holds(MemKind::Host, &m(1, 3, 0)));
    // Peers and kinds have bounds of their own.
    assert!(r.retire(MemKind::Device, m(2, 1, 0), 2).is_empty());
    assert!(r.retire(MemKind::Host, m(1, 1, 0), 2).is_empty());
    assert_eq!(r.len(), 4);
    let mut all = r.drain();
    all.sort_by_key(|(k, m)| (*k == MemKind::Host, m.peer, m.buffer_id));
    assert_eq!(all.len(), 4);
    assert!(r.is_empty());
}

#[test]
fn a_bound_of_zero_keeps_nothing() {
    let mut r = Retained::default();
    assert_eq!(r.retire(MemKind::Host, m(0, 5, 0), 0), vec![m(0, 5, 0)]);
    assert!(r.is_empty());
}
