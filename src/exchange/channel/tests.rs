use super::*;

#[test]
fn fingerprints_that_differ_in_one_half_are_told_apart() {
    let fp = (7u128 << 64) | 5;
    let mut by_fp = FastMap::default();
    by_fp.insert(fp, 1);
    by_fp.insert(fp ^ (1 << 64), 2);
    assert_eq!(by_fp.get(&fp), Some(&1));
    assert_eq!(by_fp.get(&(fp ^ (1 << 64))), Some(&2));
}

#[test]
fn send_and_recv_name_the_same_channel() {
    let s = Request::send(1, "comm", 0x10, 4, MemKind::Host);
    let r = Request::recv(0, "comm", 0x20, 4, MemKind::Host);
    assert_eq!(ChannelKey::of(0, &s, 0), ChannelKey::of(1, &r, 0));
    let back = Request::send(0, "comm", 0x20, 4, MemKind::Host);
    assert_ne!(ChannelKey::of(0, &s, 0), ChannelKey::of(1, &back, 0));
}

#[test]
fn occurrences_count_per_peer_direction_tag() {
    let reqs = vec![
        Request::send(1, "a", 1, 1, MemKind::Host),
        Request::send(1, "a", 2, 1, MemKind::Host),
        Request::recv(1, "a", 3, 1, MemKind::Host),
        Request::send(2, "a", 4, 1, MemKind::Host),
        Request::send(1, "a", 5, 1, MemKind::Host),
        Request::send(1, "b", 6, 1, MemKind::Host),
    ];
    let occurrences: Vec<u32> = (0..reqs.len()).map(|i| occurrence(&reqs, i)).collect();
    assert_eq!(occurrences, vec![0, 1, 0, 0, 2, 0]);
}

#[test]
fn keys_are_unique_per_version_and_exporter() {
    let k = ChannelKey {
        src: 0,
        dst: 1,
        tag: "x/y".into(),
        occurrence: 0,
    };
    let names = CacheNames::new("job", "", 1);
    let a = k.record_key(&names, 0, 1);
    assert_eq!(a, "nvfipc/job//g1/h/0/1/0/1/x/y#0");
    assert_ne!(a, k.record_key(&names, 0, 2));
    assert_ne!(a, k.record_key(&names, 1, 1));
    assert_eq!(k.describe(), "0/1/x/y#0");
    let k2 = ChannelKey {
        tag: "x/y#0".into(),
        occurrence: 1,
        ..k.clone()
    };
    assert_ne!(k.describe(), k2.describe());
}

#[test]
fn fingerprints_are_those_of_the_description() {
    let reqs = [
        Request::send(1, "comm", 1, 1, MemKind::Host),
        Request::recv(12, "x/y#0", 1, 1, MemKind::Host),
        Request::send(4095, "", 1, 1, MemKind::Device),
    ];
    for rank in [0, 3, 100_000] {
        for r in &reqs {
            for occ in [0, 1, 10, u32::MAX] {
                let key = ChannelKey::of(rank, r, occ);
                let fp = super::super::board::fingerprint(&key.describe());
                assert_eq!(fingerprint_of(rank, r, occ), fp, "{key}");
                assert!(key.is_of(rank, r, occ));
                assert!(!key.is_of(rank, r, occ.wrapping_add(1)));
                assert!(!key.is_of(rank + 1, r, occ));
            }
        }
    }
    let other_tag = Request::send(1, "comm2", 1, 1, MemKind::Host);
    assert!(!ChannelKey::of(0, &reqs[0], 0).is_of(0, &other_tag, 0));
}
use crate::node::PeerProcess;

fn channel(validity: &Arc<Validity>) -> OpenChannel {
    let info = ChannelInfo {
        key: ChannelKey {
            src: 0,
            dst: 1,
            tag: "t".into(),
            occurrence: 0,
        },
        peer: 1,
        kind: MemKind::Host,
        slot: 0,
        entry: 0,
        fp: 0,
    };
    let handles = P2pHandles {
        kind: MemKind::Host,
        local_ptr: 0x1000,
        local_bytes: 8,
        local_semaphore: 0x2000,
        peer_ptr: 0x3000,
        peer_bytes: 8,
        peer_semaphore: 0x4000,
        epochs: Default::default(),
        peer: PeerProcess {
            rank: 1,
            pid: 0,
            checkable: false,
        },
    };
    let settings = Arc::new(Settings::new(Duration::from_secs(3)));
    OpenChannel::new(handles, Arc::new(info), validity.clone(), 0, settings)
}

#[test]
fn a_bump_makes_earlier_handles_stale_and_later_ones_current() {
    let v = Arc::new(Validity::default());
    let old = channel(&v);
    assert_eq!(old.handles().unwrap().peer_ptr, 0x3000);
    assert!(old.is_send() && old.peer() == 1 && old.tag() == "t");
    assert_eq!(old.timeout(), Duration::from_secs(3));
    v.bump();
    let err = old.handles().unwrap_err();
    assert_eq!(err.status, crate::error::Status::InvalidState);
    assert!(
        err.message.contains("peer 1") && err.message.contains("tag \"t\""),
        "{err}"
    );
    assert!(err.message.contains("re-open the channel"), "{err}");
    let new = channel(&v);
    assert!(new.handles().is_ok() && old.handles().is_err());
}

#[test]
fn failure_and_close_are_final_and_say_so() {
    let v = Arc::new(Validity::default());
    let ch = channel(&v);
    v.fail();
    assert!(ch.handles().unwrap_err().message.contains("failed"));
    v.bump();
    assert_eq!(v.current(), FAILED, "a failed channel stays failed");
    v.close();
    v.fail();
    v.bump();
    assert_eq!(v.current(), CLOSED, "a closed channel stays closed");
    assert!(ch.handles().unwrap_err().message.contains("was freed"));
}
