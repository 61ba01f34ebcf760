use super::*;

#[test]
fn quantiles_by_nearest_rank() {
    let s = [5, 1, 4, 2, 3];
    assert_eq!(median(&s), Some(3));
    assert_eq!(quantile(&s, 0.9), Some(5));
    assert_eq!(quantile(&s, 0.0), Some(1));
    assert_eq!(quantile(&[7], 0.9), Some(7));
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[1, 2, 3, 4]), Some(2));
}

#[test]
fn durations_read_well() {
    assert_eq!(fmt_ns(950), "950 ns");
    assert_eq!(fmt_ns(12_345), "12.3 us");
    assert_eq!(fmt_ns(4_560_000), "4.56 ms");
    assert_eq!(fmt_ns(1_230_000_000), "1.23 s");
    assert_eq!(fmt_opt_ns(None), "-");
}

#[test]
fn samples_round_trip_and_tables_align() {
    let s = vec![1, 22, 333];
    assert_eq!(decode_samples(&encode_samples(&s)), Some(s));
    assert_eq!(decode_samples(""), Some(vec![]));
    assert_eq!(decode_samples("1 x"), None);
    let t = format_table(&[
        vec!["a".into(), "bb".into(), "c".into()],
        vec!["ddd".into(), "e".into(), "f".into()],
    ]);
    assert_eq!(t, "a    bb  c\nddd  e   f\n");
}
