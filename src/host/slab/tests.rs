use super::*;
use crate::host::tests::fdpass_pair;
use crate::transport::slab::SLAB_SLOTS;
use crate::transport::slot_address;

#[test]
fn slots_are_shared_with_an_importer() {
    let (fa, fb) = fdpass_pair("unit_slab");
    let a = new_slab("unit_slab", fa.clone()).unwrap();
    let b = new_slab("unit_slab", fb).unwrap();
    let slot = a.allocate_slot().unwrap();
    assert_eq!(slot, 0);
    let handle = a.export().unwrap();
    assert_eq!(a.export().unwrap(), handle, "registered once");
    let t = Duration::from_secs(5);
    let first = b.import_peer(0, &handle, t).unwrap();
    let again = b.import_peer(0, &handle, t).unwrap();
    assert_eq!(again, first, "deduplicated");
    let base = first.base();
    assert_eq!(b.live_peer_slabs(), 1);
    // SAFETY: `base` maps a's slab; slot 0 is inside it and 4-byte aligned.
    let remote = unsafe { &*(slot_address(base, slot) as *const AtomicU32) };
    remote.store(5, Ordering::Release);
    // SAFETY: slot 0 of a's own slab, mapped while `a` lives.
    let own = unsafe { &*(a.local(slot).unwrap() as *const AtomicU32) };
    assert_eq!(own.load(Ordering::Acquire), 5);
    a.free_slot(slot).unwrap();
    assert_eq!(remote.load(Ordering::Acquire), 0, "freed slots are reset");
    drop(first);
    assert_eq!(b.live_peer_slabs(), 1);
    drop(again);
    assert_eq!(b.live_peer_slabs(), 0);
    assert!(a.local(SLAB_SLOTS).is_err());
    let fdpass = fa;
    assert_eq!(fdpass.registered(), 1);
    drop(a);
    assert_eq!(fdpass.registered(), 0, "withdrawn with the slab");
}
