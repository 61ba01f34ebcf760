use super::*;

fn id() -> FdId {
    FdId {
        serial: 9,
        fd: 3,
        dev: 4,
        ino: 5,
    }
}

#[test]
fn a_notice_round_trips_and_garbage_is_named() {
    let n = Notice {
        rank: 2,
        pid: 77,
        record_len: 256,
        id: id(),
    };
    assert_eq!(Notice::decode(&n.encode(), "k").unwrap(), n);
    let empty = Notice::decode(&[], "k").unwrap_err();
    assert!(
        empty.message.contains("deleted before"),
        "{}",
        empty.message
    );
    let mut old = vec![0u8; 256];
    old[..4].copy_from_slice(b"NVFI");
    let e = Notice::decode(&old, "k").unwrap_err();
    assert!(e.message.contains("handle record itself"), "{}", e.message);
    let mut huge = n;
    huge.record_len = u32::MAX;
    assert!(Notice::decode(&huge.encode(), "k").is_err());
    assert!(Notice::decode(&n.encode()[..40], "k").is_err());
}

#[test]
fn a_sealed_file_is_read_only_for_its_key_and_length() {
    let content = file_content("nvfipc/j/h/0/1", b"record!");
    assert_eq!(
        record_of(&content, "nvfipc/j/h/0/1", 7, "r").unwrap(),
        b"record!"
    );
    let moved = record_of(&content, "nvfipc/j/h/0/2", 7, "r").unwrap_err();
    assert!(moved.message.contains("written for"), "{}", moved.message);
    assert!(record_of(&content, "nvfipc/j/h/0/1", 6, "r").is_err());
    assert!(record_of(&content[..content.len() - 1], "nvfipc/j/h/0/1", 7, "r").is_err());
}

#[test]
fn an_immutable_file_cannot_be_changed_or_read_unsealed() {
    let fd = memfd::create_immutable("unit", b"abc").unwrap();
    let mut f = std::fs::File::from(fd.try_clone().unwrap());
    assert!(std::io::Write::write_all(&mut f, b"x").is_err());
    assert!(f.set_len(1).is_err());
    assert_eq!(memfd::read_immutable(fd, 16, "unit").unwrap(), b"abc");
    let plain = memfd::create("unit-plain").unwrap();
    let err = memfd::read_immutable(plain, 16, "plain").unwrap_err();
    assert!(err.message.contains("not sealed"), "{}", err.message);
}
