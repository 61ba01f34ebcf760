use super::*;

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
    assert_eq!(occurrences(&reqs), vec![0, 1, 0, 0, 2, 0]);
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
                assert_eq!(key.fingerprint(), fp, "{key}");
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
