use super::*;
use crate::args::parse;

#[test]
fn parses_options_and_rejects_nonsense() {
    let a: DemoArgs = parse(&[
        "--ranks",
        "4",
        "--iters=3",
        "--bytes",
        "10",
        "--transport",
        "host",
    ])
    .unwrap();
    assert_eq!((a.ranks, a.iters, a.bytes), (4, 3, 10));
    assert_eq!(a.transport, TransportChoice::Host);
    let rank_args = a.rank_args(MemKind::Host);
    let rank_args: Vec<&str> = rank_args.iter().map(String::as_str).collect();
    assert_eq!(
        parse::<DemoArgs>(&rank_args).unwrap().transport,
        TransportChoice::Host
    );
    for bad in [
        &["--ranks", "1"][..],
        &["--iters", "0"],
        &["--bytes", "0"],
        &["--transport", "gpu"],
        &["--what"],
    ] {
        assert!(parse::<DemoArgs>(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn patterns_differ_by_rank_iteration_and_position() {
    let a = pattern(0, 0, 64);
    assert_eq!(a.len(), 64);
    assert_ne!(a, pattern(1, 0, 64));
    assert_ne!(a, pattern(0, 1, 64));
    assert_ne!(a[..4], a[4..8]);
    assert_eq!(pattern(3, 2, 7), pattern(3, 2, 8)[..7]);
    assert!(verify(&pattern(2, 5, 33), 2, 5).is_ok());
    let mut bad = pattern(2, 5, 33);
    bad[17] ^= 1;
    let err = verify(&bad, 2, 5).unwrap_err();
    assert!(
        err.message.contains("rank 2") && err.message.contains("byte 17"),
        "{err}"
    );
}

#[test]
fn swap_step_leaves_cached_steps_around_it() {
    assert_eq!(swap_step(1), None);
    assert_eq!(swap_step(2), None);
    assert_eq!(swap_step(3), Some(1));
    assert_eq!(swap_step(10), Some(5));
}

#[test]
fn results_round_trip() {
    let r = RankResult {
        cold_ns: 5,
        warm_median_ns: None,
        swap_ns: Some(7),
        verified_bytes: 100,
        store_round_trips: 4,
        hits: 3,
        misses: 2,
        opens: 6,
    };
    assert_eq!(RankResult::decode(&r.encode()), Some(r));
    assert_eq!(RankResult::decode("1 2"), None);
}
