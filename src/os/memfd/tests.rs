use super::*;

#[test]
fn a_mapping_is_shared_through_its_descriptor() {
    let a = create_mapped("unit-memfd", 8192).unwrap();
    let fd = a.fd().try_clone_to_owned().unwrap();
    let b = SharedMapping::map(fd, 8192, "unit-memfd").unwrap();
    assert_ne!(a.addr(), b.addr());
    // SAFETY: both addresses map the same 8192-byte file.
    unsafe {
        *((a.addr() + 4096) as *mut u32) = 0xfeed_f00d;
        assert_eq!(*((b.addr() + 4096) as *const u32), 0xfeed_f00d);
    }
    drop(a);
    // SAFETY: `b` still maps the file, which lives as long as one mapping or descriptor.
    assert_eq!(unsafe { *((b.addr() + 4096) as *const u32) }, 0xfeed_f00d);
}

#[test]
fn short_files_and_impossible_sizes_are_errors() {
    let short = create_mapped("unit-short", 4096).unwrap();
    let fd = short.fd().try_clone_to_owned().unwrap();
    let err = SharedMapping::map(fd, 8192, "unit-short").unwrap_err();
    assert!(err.message.contains("expected at least 8192"), "{err}");
    assert!(create_mapped("unit-zero", 0).is_err());
    let err = create_mapped("unit-huge", 1 << 62).unwrap_err();
    assert!(err.message.contains("bytes requested"), "{err}");
}

#[test]
fn headroom_is_parsed() {
    let info = "MemTotal:  100 kB\nMemAvailable:    2048 kB\n";
    assert_eq!(mem_available(info), Some(2 << 20));
    assert_eq!(mem_available("MemTotal: 1 kB\n"), None);
    assert_eq!(cgroup_left("max", "5"), None);
    assert_eq!(cgroup_left("100", "30"), Some(70));
    assert_eq!(cgroup_left("10", "30"), Some(0));
    let h = Headroom {
        available: Some(10),
        cgroup_left: Some(4),
    };
    assert_eq!(h.bytes(), Some(4));
    assert!(h.describe().contains("cgroup"));
    let none = Headroom {
        available: None,
        cgroup_left: None,
    };
    assert_eq!(none.bytes(), None);
}
