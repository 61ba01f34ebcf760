use super::*;

#[test]
fn ids_round_trip_and_revocation_is_told_from_unknown() {
    let reg = Registry::default();
    let fd = crate::os::memfd::create("registry-test").unwrap();
    let id = reg.register(fd).unwrap();
    assert_ne!(id.serial, 0);
    assert_eq!(FdId::decode(&id.encode()), Some(id));
    assert_eq!(FdId::decode(&id.encode()[..31]), None);
    let mut bad = id.encode();
    bad[0] = b'X';
    assert_eq!(FdId::decode(&bad), None);
    let held = reg.lookup(id.serial).unwrap();
    assert!(reg.unregister(&id));
    assert!(!reg.unregister(&id));
    assert_eq!(reg.lookup(id.serial).unwrap_err(), ErrorCode::Revoked);
    assert_eq!(
        reg.lookup(id.serial.wrapping_add(1)).unwrap_err(),
        ErrorCode::UnknownId
    );
    assert_eq!(reg.lookup(0).unwrap_err(), ErrorCode::UnknownId);
    // The descriptor stays open while a lookup holds it.
    assert_eq!(sys::file_identity(held.as_fd()).unwrap(), (id.dev, id.ino));
    assert_eq!(reg.len(), 0);
}

#[test]
fn serials_are_not_guessable_from_small_numbers_or_from_each_other() {
    let reg = Registry::default();
    let ids: Vec<FdId> = (0..64)
        .map(|i| {
            reg.register(crate::os::memfd::create(&format!("serial-{i}")).unwrap())
                .unwrap()
        })
        .collect();
    // What an outsider tried: the small numbers, and neighbours of a serial it saw.
    for guess in 0..=1024u64 {
        assert_eq!(
            reg.lookup(guess).unwrap_err(),
            ErrorCode::UnknownId,
            "{guess}"
        );
    }
    let serials: std::collections::HashSet<u64> = ids.iter().map(|id| id.serial).collect();
    assert_eq!(serials.len(), ids.len(), "distinct");
    for pair in ids.windows(2) {
        let (a, b) = (pair[0].serial, pair[1].serial);
        assert!(a.abs_diff(b) > 1 << 20, "{a:#x} then {b:#x}");
    }
    // Spread over the whole range: the top bits vary.
    let tops: std::collections::HashSet<u64> = ids.iter().map(|id| id.serial >> 60).collect();
    assert!(tops.len() > 4, "{tops:?}");
    // Another registry (another process) gives other serials.
    let other = Registry::default();
    let first = other
        .register(crate::os::memfd::create("serial-other").unwrap())
        .unwrap();
    assert_ne!(first.serial, ids[0].serial);
    assert!(other.lookup(ids[0].serial).is_err());
    for id in &ids {
        assert!(reg.lookup(id.serial).is_ok());
    }
    // The permutation inverts exactly.
    let t = lock(&reg.table);
    for c in [1u64, 2, 3, u64::MAX, 1 << 40] {
        assert_eq!(t.keys.counter_of(t.keys.serial_of(c)), c);
    }
}
