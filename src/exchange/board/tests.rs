use super::*;
use crate::fdpass::TrustedUids;

/// Whether [`OwnBoard::mark_closed`] was called.
fn is_closed(own: &OwnBoard) -> bool {
    own.table.header().closed.load(Ordering::SeqCst) != 0
}

fn name(tag: &str) -> String {
    format!("/nvfipc-unitboard-{}-{tag}", std::process::id())
}

#[test]
fn publish_and_read_across_mappings() {
    let n = name("a");
    let own = OwnBoard::create(&n, 3, TrustedUids::own()).unwrap();
    let peer = PeerBoard::try_open(&n, 3, &TrustedUids::own())
        .unwrap()
        .unwrap();
    assert!(
        PeerBoard::try_open(&n, 2, &TrustedUids::own())
            .unwrap()
            .is_none(),
        "wrong rank"
    );
    let fp = fingerprint("0/1/tag/0");
    assert_eq!(peer.find(fp), None);
    let e = own.insert(fp).unwrap();
    assert_eq!(own.insert(fp).unwrap(), e);
    assert_eq!(peer.find(fp), Some(e));
    assert_eq!(peer.read(e, 1), None);
    let at = |offset| BufferAt {
        alloc_id: 7,
        offset,
        bytes: 64,
        known_to_peer: offset > 0,
    };
    own.publish(e, 1, 10, at(0));
    assert_eq!(peer.read(e, 1), Some((10, at(0))));
    own.publish(e, 2, 11, at(128));
    // A reader still at step 1 keeps seeing step 1's version and place.
    assert_eq!(peer.read(e, 1), Some((10, at(0))));
    assert_eq!(peer.read(e, 2), Some((11, at(128))));
    assert_eq!(peer.step(e), 2);
    assert_eq!(peer.owner().pid, std::process::id());
    assert!(!peer.owner().is_dead());
    assert_eq!(peer.opened(e), 0);
    own.publish_opened(e, 4);
    assert_eq!(peer.opened(e), 4);
}

#[test]
fn a_peer_blocked_on_the_board_wakes_at_the_owners_publish() {
    let n = name("w");
    let own = OwnBoard::create(&n, 1, TrustedUids::own()).unwrap();
    let e = own.insert(fingerprint("1/0/w/0")).unwrap();
    // No sleeper: a publish makes no wake.
    own.publish(e, 1, 1, BufferAt::default());
    assert_eq!(own.table.header().wake.load(Ordering::Relaxed), 0);
    let waiter = {
        let n = n.clone();
        std::thread::spawn(move || {
            let peer = PeerBoard::try_open(&n, 1, &TrustedUids::own())
                .unwrap()
                .unwrap();
            let start = std::time::Instant::now();
            let mut blocks = 0;
            while peer.read(e, 2).is_none() {
                blocks += 1;
                peer.block(Duration::from_secs(60), || peer.read(e, 2).is_none());
            }
            (start.elapsed(), blocks)
        })
    };
    // Publish once the waiter sleeps.
    while own.table.header().sleepers.load(Ordering::SeqCst) == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(20));
    own.publish(e, 2, 2, BufferAt::default());
    let (took, blocks) = waiter.join().unwrap();
    assert!(
        took < Duration::from_secs(30),
        "woken, not timed out: {took:?}"
    );
    assert!(blocks >= 1);
    assert!(own.table.header().wake.load(Ordering::Relaxed) >= 1);
    assert_eq!(own.table.header().sleepers.load(Ordering::SeqCst), 0);
}

#[test]
fn known_lists_say_which_peer_allocations_the_owner_holds() {
    let n = name("k");
    let own = OwnBoard::create(&n, 0, TrustedUids::own()).unwrap();
    let peer = PeerBoard::try_open(&n, 0, &TrustedUids::own())
        .unwrap()
        .unwrap();
    let e = own.insert(fingerprint("0/1/k/0")).unwrap();
    assert!(!peer.knows(e, 5) && !peer.knows(e, 0));
    own.set_known(e, &[5, 6]);
    assert!(peer.knows(e, 5) && peer.knows(e, 6));
    assert_eq!(own.known(e), vec![5, 6]);
    own.forget_known(e, 5);
    assert!(!peer.knows(e, 5) && peer.knows(e, 6));
    own.set_known(e, &[7]);
    assert_eq!(own.known(e), vec![7]);
    assert!(!peer.knows(e, 6));
}

#[test]
fn closed_is_seen_by_peers_and_survives_the_unlink() {
    let n = name("d");
    let own = OwnBoard::create(&n, 1, TrustedUids::own()).unwrap();
    let peer = PeerBoard::try_open(&n, 1, &TrustedUids::own())
        .unwrap()
        .unwrap();
    assert!(!peer.closed());
    assert!(!is_closed(&own));
    own.mark_closed();
    assert!(is_closed(&own));
    assert!(peer.closed());
    drop(own);
    // A peer that mapped the board keeps reading it after the owner unlinked it.
    assert!(peer.closed());
    assert!(PeerBoard::try_open(&n, 1, &TrustedUids::own())
        .unwrap()
        .is_none());
}

#[test]
fn a_board_of_another_layout_is_refused() {
    let n = name("e");
    let own = OwnBoard::create(&n, 0, TrustedUids::own()).unwrap();
    own.table
        .header()
        .magic
        .store(u64::from_le_bytes(*b"NVFIBRD1"), Ordering::Relaxed);
    let err = PeerBoard::try_open(&n, 0, &TrustedUids::own())
        .err()
        .unwrap();
    assert!(err.message.contains("unknown layout"), "{err}");
}

#[test]
fn colliding_fingerprints_probe() {
    let n = name("b");
    let own = OwnBoard::create(&n, 0, TrustedUids::own()).unwrap();
    let peer = PeerBoard::try_open(&n, 0, &TrustedUids::own())
        .unwrap()
        .unwrap();
    let a = 5u128 | (1u128 << 64);
    let b = 5u128 | (2u128 << 64); // same start slot, different fingerprint
    let ea = own.insert(a).unwrap();
    let eb = own.insert(b).unwrap();
    assert_ne!(ea, eb);
    assert_eq!(peer.find(a), Some(ea));
    assert_eq!(peer.find(b), Some(eb));
}

#[test]
fn second_owner_in_one_process_is_refused_and_drop_unlinks() {
    let n = name("c");
    let own = OwnBoard::create(&n, 0, TrustedUids::own()).unwrap();
    let err = OwnBoard::create(&n, 0, TrustedUids::own()).err().unwrap();
    assert!(err.message.contains("own scope"), "{err}");
    drop(own);
    assert!(PeerBoard::try_open(&n, 0, &TrustedUids::own())
        .unwrap()
        .is_none());
}

#[test]
fn fingerprints_match_the_two_fnv1a_hashes_and_stream_in_pieces() {
    use crate::hash::fnv1a64;
    let d = "12/3/x/y#7";
    let salted = [&[FINGERPRINT_SALT][..], d.as_bytes()].concat();
    let expected = (u128::from(fnv1a64(&salted)) << 64) | u128::from(fnv1a64(d.as_bytes()));
    assert_eq!(fingerprint(d), expected);
    let mut f = Fingerprinter::new();
    f.write_decimal(12);
    f.write(b"/");
    f.write_decimal(3);
    f.write(b"/x/y#");
    f.write_decimal(7);
    assert_eq!(f.finish(), expected);
    for n in [0u64, 9, 10, 99, 100, 4096, u64::MAX] {
        let mut f = Fingerprinter::new();
        f.write_decimal(n);
        assert_eq!(f.finish(), fingerprint(&n.to_string()), "{n}");
    }
}

/// Resizes a board's file as another process of the same uid could.
fn resize(name: &str, len: u64) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm{name}"))
        .unwrap()
        .set_len(len)
        .unwrap();
}

#[test]
fn a_truncated_board_reads_zeros_and_is_an_error_for_owner_and_peer() {
    let n = name("t");
    let own = OwnBoard::create(&n, 2, TrustedUids::own()).unwrap();
    let peer = PeerBoard::try_open(&n, 2, &TrustedUids::own())
        .unwrap()
        .unwrap();
    let fp = fingerprint("2/0/t/0");
    let e = own.insert(fp).unwrap();
    own.publish(e, 1, 5, BufferAt::default());
    assert!(peer.read(e, 1).is_some());
    assert!(own.check(true).is_ok() && peer.check(true).is_ok());
    resize(&n, 0);
    // Reads see zeros ("not there yet"), not SIGBUS; the owner's writes are absorbed.
    assert_eq!(peer.read(e, 1), None);
    assert_eq!(peer.find(fp), None);
    own.publish(e, 2, 6, BufferAt::default());
    let err = peer.check(false).unwrap_err();
    assert_eq!(err.status, crate::error::Status::Protocol);
    for needle in ["peer rank 2", &n, "truncated or shrunk", "create new ones"] {
        assert!(err.message.contains(needle), "{needle}: {err}");
    }
    let err = own.check(false).unwrap_err();
    assert!(err.message.contains("this rank's own board"), "{err}");
    // The owner is still known, from before the truncation.
    assert_eq!(peer.owner().pid, std::process::id());
    assert!(!peer.owner().is_dead());
    assert!(!peer.closed());
}

#[test]
fn a_shrunk_board_is_found_before_its_lost_pages_are_read() {
    let n = name("s");
    let own = OwnBoard::create(&n, 0, TrustedUids::own()).unwrap();
    let peer = PeerBoard::try_open(&n, 0, &TrustedUids::own())
        .unwrap()
        .unwrap();
    resize(&n, 4096);
    // Nothing past the first page was read yet: only a probe, which touches the last page,
    // finds it.
    assert!(own.check(false).is_ok());
    let err = own.check(true).unwrap_err();
    assert!(err.message.contains("truncated or shrunk"), "{err}");
    assert!(peer.check(true).is_err());
}

#[test]
fn fingerprints_differ() {
    assert_ne!(fingerprint("0/1/a/0"), fingerprint("1/0/a/0"));
    assert_ne!(fingerprint("0/1/a/0"), fingerprint("0/1/a/1"));
}

#[test]
fn a_board_file_of_another_user_is_never_read() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIPPED: not root, cannot give a file to another uid");
        return;
    }
    let n = name("foreign");
    let own = OwnBoard::create(&n, 2, TrustedUids::own()).unwrap();
    let path = format!("/dev/shm{n}");
    std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
    let err = PeerBoard::try_open(&n, 2, &TrustedUids::own())
        .err()
        .expect("refused");
    assert_eq!(err.status, crate::error::Status::Protocol);
    assert!(err.message.contains("uid 65534"), "{}", err.message);
    drop(own);
}

#[test]
fn an_entry_index_past_the_board_panics_instead_of_reading_past_the_mapping() {
    let n = name("bounds");
    let own = OwnBoard::create(&n, 0, TrustedUids::own()).unwrap();
    let peer = PeerBoard::try_open(&n, 0, &TrustedUids::own())
        .unwrap()
        .unwrap();
    assert_eq!(peer.step(CAPACITY - 1), 0, "the last entry is inside");
    for index in [CAPACITY, u32::MAX] {
        let read = std::panic::catch_unwind(|| peer.read(index, 1));
        assert!(read.is_err(), "entry {index} was read");
        let publish = std::panic::catch_unwind(|| own.publish_opened(index, 1));
        assert!(publish.is_err(), "entry {index} was written");
    }
}

#[test]
fn a_segment_shorter_than_the_header_is_no_table() {
    let n = name("short");
    let seg = ShmSegment::create(&n, HEADER - 8).unwrap();
    let err = Table::new(seg).err().expect("a table of a short segment");
    assert!(err.message.contains("less than its"), "{err}");
    let seg = ShmSegment::create(&name("header"), HEADER).unwrap();
    assert_eq!(
        Table::new(seg).unwrap().entries,
        0,
        "a header alone has no entries"
    );
}
