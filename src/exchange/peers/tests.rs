use super::*;
use crate::exchange::session::Counters;
use crate::fdpass::TrustedUids;
use crate::transport::record::{local_host, HandleType};

fn rec(buffer_id: u64, slot: u32) -> Record {
    Record {
        handle_type: HandleType::PosixFd,
        flags: 0,
        offset: 0,
        bytes: 64,
        alloc_bytes: 4096,
        buffer_id,
        host_id: local_host().id,
        version: 1,
        device_uuid: [0; 16],
        pid: 42,
        rank: 1,
        host_name: [0; 32],
        payload: [buffer_id as u8; 64],
        sem_type: HandleType::PosixFd,
        sem_slot: slot,
        sem_payload: [9; 64],
        segments: Vec::new(),
    }
}

#[test]
fn a_known_allocation_gives_records_for_new_places() {
    let mut k = KnownAllocations::default();
    k.learn(1, MemKind::Host, &rec(5, 3));
    let channel = rec(6, 7);
    let got = k
        .record_for((1, 42, MemKind::Host, 5), 1024, 512, 9, &channel)
        .unwrap();
    assert_eq!(got.payload, [5; 64], "the allocation's handle");
    assert_eq!(got.sem_slot, 7, "the channel's semaphore");
    assert_eq!((got.offset, got.bytes, got.version), (1024, 512, 9));
    // Unknown allocation, kind, pid, or a place outside the allocation: no record.
    assert!(k
        .record_for((1, 42, MemKind::Host, 6), 0, 8, 9, &channel)
        .is_none());
    assert!(k
        .record_for((1, 42, MemKind::Device, 5), 0, 8, 9, &channel)
        .is_none());
    assert!(k
        .record_for((1, 43, MemKind::Host, 5), 0, 8, 9, &channel)
        .is_none());
    assert!(k
        .record_for((1, 42, MemKind::Host, 5), 4000, 97, 9, &channel)
        .is_none());
    assert!(k
        .record_for((1, 42, MemKind::Host, 5), 0, 0, 9, &channel)
        .is_none());
}

#[test]
fn the_table_is_bounded() {
    let mut k = KnownAllocations::default();
    for id in 0..MAX_KNOWN as u64 + 1 {
        k.learn(0, MemKind::Host, &rec(id, 0));
    }
    assert!(k.records.len() <= MAX_KNOWN);
}

#[test]
fn keeps_the_listed_records_most_recent_first_and_bounded() {
    let mut h = HeldRecords::default();
    assert_eq!(h.imported(&[], &rec(5, 0)), vec![5]);
    assert_eq!(h.imported(&[5], &rec(6, 0)), vec![6, 5]);
    // 5 was released (taken off the board's list): its record goes at the next import.
    assert!(h.record_for(5, 0, 8, 3, &rec(6, 1)).is_some());
    assert_eq!(h.imported(&[6], &rec(7, 0)), vec![7, 6]);
    assert!(h.record_for(5, 0, 8, 3, &rec(6, 1)).is_none());
    let got = h.record_for(6, 128, 64, 9, &rec(7, 4)).unwrap();
    assert_eq!(
        (got.buffer_id, got.offset, got.bytes, got.version),
        (6, 128, 64, 9)
    );
    assert_eq!(got.sem_slot, 4, "the channel's semaphore");
    // Again the same allocation: moved first, not twice.
    assert_eq!(h.imported(&[7, 6], &rec(6, 0)), vec![6, 7]);
    let mut listed = vec![6, 7];
    for id in 10..30 {
        listed = h.imported(&listed, &rec(id, 0));
    }
    assert_eq!(listed.len(), KNOWN_PER_CHANNEL);
    assert_eq!(listed[0], 29);
}

/// Mappings kept.
fn len(r: &Retained) -> usize {
    r.kept.values().map(VecDeque::len).sum()
}

fn m(peer: usize, buffer_id: u64, offset: u64) -> HeldMapping {
    let base = 0x1000 * buffer_id;
    let mapping = PeerMapping::new(peer, base, 0x1000, buffer_id, ()).at(offset);
    Counters::default().hold(mapping)
}

/// (peer, allocation, pointer) of each guard.
fn ids(guards: &[HeldMapping]) -> Vec<(usize, u64, u64)> {
    guards
        .iter()
        .map(|g| (g.peer(), g.buffer_id(), g.ptr()))
        .collect()
}

#[test]
fn keeps_distinct_allocations_up_to_the_bound_oldest_out() {
    let mut r = Retained::default();
    assert!(r.retire(MemKind::Device, m(1, 1, 0), 2).is_empty());
    assert!(r.retire(MemKind::Device, m(1, 2, 0), 2).is_empty());
    // Another buffer of a kept allocation: its guard goes back at once.
    let back = r.retire(MemKind::Device, m(1, 1, 64), 2);
    assert_eq!(ids(&back), ids(&[m(1, 1, 64)]));
    assert_eq!(len(&r), 2);
    // A third allocation evicts the least recently replaced one (2: 1 was refreshed).
    let out = r.retire(MemKind::Device, m(1, 3, 0), 2);
    assert_eq!(ids(&out), ids(&[m(1, 2, 0)]));
    assert!(r.holds(MemKind::Device, &m(1, 1, 128)));
    assert!(!r.holds(MemKind::Device, &m(1, 2, 0)));
    assert!(!r.holds(MemKind::Host, &m(1, 3, 0)));
    // Peers and kinds have bounds of their own.
    assert!(r.retire(MemKind::Device, m(2, 1, 0), 2).is_empty());
    assert!(r.retire(MemKind::Host, m(1, 1, 0), 2).is_empty());
    assert_eq!(len(&r), 4);
    let all = std::mem::take(&mut r);
    assert_eq!(len(&all), 4);
    assert!(len(&r) == 0);
}

#[test]
fn a_bound_of_zero_keeps_nothing() {
    let mut r = Retained::default();
    let back = r.retire(MemKind::Host, m(0, 5, 0), 0);
    assert_eq!(ids(&back), ids(&[m(0, 5, 0)]));
    assert!(len(&r) == 0);
}

/// A store of one peer's node key holding `value`, and the names of its cache (unique to the
/// test, so its board name is too).
fn node_key_holding(test: &str, value: &[u8]) -> (crate::store::memory::MemoryStore, CacheNames) {
    let names = CacheNames::new(&format!("peers-{}-{test}", std::process::id()), "", 1);
    let store = crate::store::memory::MemoryStore::new();
    store.set(&names.node_key(1), value).unwrap();
    (store, names)
}

fn check_peer_1(store: &dyn Store, names: &CacheNames) -> Error {
    let nodes = PeerNodes::default();
    let err = nodes.check(store, names, 0, &[1], Duration::from_secs(5));
    err.unwrap_err()
}

/// A peer that closes its cache deletes its node key: read between the peer's set and delete,
/// it is empty (what a store's GET gives for a missing key), and the error says the peer left.
#[test]
fn a_node_key_deleted_under_the_reader_says_the_peer_left() {
    let (store, names) = node_key_holding("deleted", b"");
    let err = check_peer_1(&store, &names);
    assert_eq!(err.status, crate::Status::InvalidState, "{err}");
    let head = format!(
        "rank 0: peer rank 1 deleted its node key {} as this rank read it: it closed its cache \
         of {names} or exited (no live board of it is here)",
        names.node_key(1)
    );
    assert!(err.message.starts_with(&head), "{}", err.message);
    assert!(
        err.message.contains("create new caches on both ranks"),
        "{}",
        err.message
    );
    assert!(!err.message.contains("version"), "{}", err.message);
    // Its board, still here and marked closed, says which.
    let board =
        super::super::board::OwnBoard::create(&names.board(1), 1, TrustedUids::own()).unwrap();
    board.mark_closed();
    let err = check_peer_1(&store, &names);
    let closed = format!("(rank 1 (pid {}) closed its cache)", std::process::id());
    assert!(err.message.contains(&closed), "{}", err.message);
}

/// Bytes that are there but are no node identity: another version of the library wrote them.
#[test]
fn a_node_key_of_another_format_names_the_version() {
    let (store, names) = node_key_holding("garbled", b"node0;what");
    let err = check_peer_1(&store, &names);
    assert_eq!(err.status, crate::Status::Protocol, "{err}");
    assert_eq!(
        err.message,
        format!(
            "rank 0: store key {} does not hold a node identity; all ranks must use the same \
             nvfuser-ipc version",
            names.node_key(1)
        )
    );
}
