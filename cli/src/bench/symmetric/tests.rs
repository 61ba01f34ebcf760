use super::*;

#[test]
fn patterns_differ_between_ranks_and_rounds() {
    assert_ne!(pattern(0, 1), pattern(1, 1));
    assert_ne!(pattern(3, 1), pattern(3, 2));
    assert_eq!(pattern(5, 4), pattern(5, 4));
}

#[test]
fn peers_are_checked_against_their_pattern() {
    let job = format!("ut-bench-symm-{}", std::process::id());
    let mine = Buffer::alloc(MemKind::Host, &job, 64).unwrap();
    let theirs = Buffer::alloc(MemKind::Host, &job, 64).unwrap();
    mine.write(&pattern(0, 2)).unwrap();
    theirs.write(&pattern(1, 2)).unwrap();
    let entry = |rank, b: &Buffer| PeerBuffer {
        rank,
        ptr: b.addr(),
        bytes: 64,
    };
    let peers = [entry(0, &mine), entry(1, &theirs)];
    check_peers(MemKind::Host, 0, 2, &peers).unwrap();
    let err = check_peers(MemKind::Host, 0, 3, &peers).unwrap_err();
    assert!(err.message.contains("rank 1's buffer"), "{err}");
    let short = [PeerBuffer {
        bytes: 8,
        ..peers[1]
    }];
    assert!(check_peers(MemKind::Host, 0, 2, &short).is_err());
}
