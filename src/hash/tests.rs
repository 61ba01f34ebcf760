use super::*;
use std::hash::BuildHasher;

#[test]
fn matches_the_published_test_vectors() {
    assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    let mut h = Fnv1a::new();
    h.write(b"foo");
    h.write(b"bar");
    assert_eq!(h.finish(), fnv1a64(b"foobar"));
}

fn hash_of(bytes: &[u8]) -> u64 {
    FastMap::<Vec<u8>, u32>::default().hasher().hash_one(bytes)
}

#[test]
fn keys_differing_only_at_their_end_spread_over_the_low_bits() {
    // hashbrown picks the bucket from the low bits: barrier keys of a large world must not
    // pile up in a few buckets.
    let mut buckets = std::collections::HashSet::new();
    for rank in 0..4096 {
        let key = format!("/nvfipc/barrier/0123456789abcdef/w131072/arrived/0/{rank}");
        buckets.insert(hash_of(key.as_bytes()) & 0xfff);
    }
    assert!(
        buckets.len() > 2048,
        "{} buckets of 4096 used",
        buckets.len()
    );
}

#[test]
fn distinct_keys_hash_differently_and_maps_work() {
    assert_ne!(hash_of(b"/a"), hash_of(b"/b"));
    assert_ne!(hash_of(b"abcdefgh1"), hash_of(b"abcdefgh2"));
    // Length is hashed too, so zero padding does not collide.
    assert_ne!(hash_of(b"a"), hash_of(b"a\0"));
    let mut m: FastMap<Vec<u8>, u32> = FastMap::default();
    for i in 0..1000u32 {
        m.insert(format!("/key{i}").into_bytes(), i);
    }
    assert_eq!(m.get(&b"/key777"[..]), Some(&777));
    assert_eq!(m.len(), 1000);
}
