use super::*;

#[test]
fn alloc_lookup_free() {
    let buf = alloc_for_job("unit_alloc", 1000).unwrap();
    let info = lookup(buf.addr() + 10, 100).unwrap();
    assert_eq!(info.base, buf.addr());
    assert_eq!(info.len, 1000);
    assert_eq!(info.id, buf.id());
    let link = std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&info.fd)
    ))
    .unwrap();
    let link = link.to_string_lossy().into_owned();
    assert!(link.starts_with("/memfd:nvfipc-unit_alloc-"), "{link}");
    assert!(lookup(buf.addr() + 990, 11)
        .unwrap_err()
        .message
        .contains("runs past"));
    buf.write(4, b"abc").unwrap();
    let mut out = [0u8; 3];
    buf.read(4, &mut out).unwrap();
    assert_eq!(&out, b"abc");
    assert!(buf.write(999, b"ab").is_err());
    let addr = buf.addr();
    drop(buf);
    let err = lookup(addr, 1).unwrap_err();
    assert!(err.message.contains("was it freed"), "{err}");
}

#[test]
fn listeners_hear_of_frees_while_they_live() {
    struct Heard(Mutex<Vec<u64>>);
    impl FreeListener for Heard {
        fn freed(&self, id: u64) {
            lock(&self.0).push(id);
        }
    }
    let heard = std::sync::Arc::new(Heard(Mutex::new(Vec::new())));
    let weak: Weak<dyn FreeListener> = std::sync::Arc::downgrade(&heard) as _;
    on_free(weak);
    let buf = alloc_for_job("unit_alloc", 64).unwrap();
    let id = buf.id();
    drop(buf);
    assert!(lock(&heard.0).contains(&id));
}

#[test]
fn free_checks_its_argument() {
    assert!(free(0x1234).is_err());
    let buf = alloc_for_job("unit_alloc", 64).unwrap();
    assert!(free(buf.addr() + 1).is_err(), "interior pointer");
    let raw = buf.into_raw();
    free(raw).unwrap();
    assert!(free(raw).unwrap_err().message.contains("already freed"));
    assert!(alloc(0).is_err());
}
