use super::*;

#[test]
fn fingerprints_hash_to_their_folded_halves() {
    let fp = (7u128 << 64) | 5;
    let mut h = FingerprintHasher::default();
    h.write_u128(fp);
    assert_eq!(h.finish(), 7 ^ 5);
    let mut by_fp = ByFingerprint::default();
    by_fp.insert(fp, 1);
    by_fp.insert(fp ^ (1 << 64), 2);
    assert_eq!(by_fp.get(&fp), Some(&1));
    assert_eq!(by_fp.get(&(fp ^ (1 << 64))), Some(&2));
}
