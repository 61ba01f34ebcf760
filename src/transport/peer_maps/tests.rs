use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Memory that counts its unmaps.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn opened(peer: usize, base: u64, unmaps: &Arc<AtomicUsize>) -> PeerMapping {
    PeerMapping::new(peer, base, 4096, 7, Counted(unmaps.clone()))
}

#[test]
fn the_last_guard_unmaps() {
    let unmaps = Arc::new(AtomicUsize::new(0));
    let m = opened(1, 0x1000, &unmaps);
    let at = m.at(64);
    let copy = at.clone();
    assert_eq!(
        (at.ptr(), at.base(), at.peer(), at.buffer_id()),
        (0x1040, 0x1000, 1, 7)
    );
    assert_eq!(at.alloc_bytes(), 4096);
    assert_eq!(copy, at);
    assert_ne!(m, at, "same mapping, another place");
    assert!(m.memory::<Counted>().is_some() && m.memory::<u32>().is_none());
    drop(m);
    drop(at);
    assert_eq!(unmaps.load(Ordering::SeqCst), 0);
    drop(copy);
    assert_eq!(unmaps.load(Ordering::SeqCst), 1);
}

#[test]
fn one_mapping_per_key_while_a_guard_lives() {
    let maps = PeerMaps::default();
    let unmaps = Arc::new(AtomicUsize::new(0));
    assert!(maps.get(&5, 0).is_none());
    let first = maps.insert(5, opened(1, 0x1000, &unmaps));
    assert_eq!(maps.live(), 1);
    let again = maps.get(&5, 32).expect("live");
    assert_eq!(again.ptr(), 0x1020);
    // Mapped twice by a race: the second is unmapped at once, the first shared.
    let raced = maps.insert(5, opened(1, 0x9000, &unmaps).at(16));
    assert_eq!(unmaps.load(Ordering::SeqCst), 1);
    assert_eq!((raced.base(), raced.ptr()), (0x1000, 0x1010));
    drop((first, again, raced));
    assert_eq!(unmaps.load(Ordering::SeqCst), 2);
    assert!(maps.live() == 0 && maps.get(&5, 0).is_none());
    // A key whose guards are gone maps afresh.
    let fresh = maps.insert(5, opened(1, 0x2000, &unmaps));
    assert_eq!((fresh.base(), maps.live()), (0x2000, 1));
}
