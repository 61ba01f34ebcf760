use super::*;

fn unique(tag: &str) -> String {
    format!("/nvfipc-test-{}-{tag}", std::process::id())
}

#[test]
fn create_open_share_and_unlink() {
    let name = unique("shm1");
    let a = ShmSegment::create(&name, 4096).unwrap();
    let b = ShmSegment::open(&name, 4096).unwrap().unwrap();
    assert_ne!(a.addr(), b.addr());
    // SAFETY: both addresses map the same 4096-byte segment.
    unsafe {
        *(a.addr() as *mut u32) = 0xdead_beef;
        assert_eq!(*(b.addr() as *const u32), 0xdead_beef);
    }
    assert!(ShmSegment::create(&name, 4096).is_err(), "O_EXCL");
    drop(a);
    assert!(ShmSegment::open(&name, 1).unwrap().is_none(), "unlinked");
    // The opener's mapping is still usable after the unlink.
    // SAFETY: `b` is still mapped.
    assert_eq!(unsafe { *(b.addr() as *const u32) }, 0xdead_beef);
}

#[test]
fn rejects_bad_names_and_short_segments() {
    assert!(ShmSegment::create("noslash", 16).is_err());
    assert!(ShmSegment::create("/a/b", 16).is_err());
    assert!(ShmSegment::create(&format!("/{}", "x".repeat(70)), 16).is_err());
    let name = unique("shm2");
    let _a = ShmSegment::create(&name, 100).unwrap();
    let err = ShmSegment::open(&name, 4096).unwrap_err();
    assert!(err.message.contains("expected at least 4096"), "{err}");
    assert!(ShmSegment::open_when_sized(&name, 4096).unwrap().is_none());
    assert!(ShmSegment::open_when_sized(&name, 100).unwrap().is_some());
}
