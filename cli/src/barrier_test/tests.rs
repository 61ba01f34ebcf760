use super::*;

#[test]
fn subsets_are_deterministic_and_valid() {
    for round in 0..50 {
        let s = subset(7, round, 64);
        assert_eq!(s, subset(7, round, 64));
        assert!(s.len() >= 2 && s.windows(2).all(|w| w[0] < w[1]) && s[s.len() - 1] < 64);
    }
    assert_ne!(subset(7, 0, 64), subset(7, 1, 64));
    assert_eq!(subset(1, 0, 1), vec![0]);
}

#[test]
fn parses_options() {
    let a: BarrierTestArgs =
        crate::args::parse(&["--rounds", "3", "--subset-seed=9", "--timeout-ms", "500"]).unwrap();
    assert_eq!(a.rounds, 3);
    assert_eq!(a.subset_seed, Some(9));
    assert_eq!(a.timeout, Some(Duration::from_millis(500)));
    assert!(crate::args::parse::<BarrierTestArgs>(&[]).is_err());
    assert!(crate::args::parse::<BarrierTestArgs>(&["--rounds=1", "--timeout-ms=0"]).is_err());
    let a: BarrierTestArgs = crate::args::parse(&[
        "--rounds=2",
        "--barrier-timeout-ms=20000",
        "--late-rank=1",
        "--late-ms=4000",
    ])
    .unwrap();
    assert_eq!(a.barrier_timeout, Some(Duration::from_secs(20)));
    assert_eq!(
        (a.late_rank, a.late),
        (Some(1), Some(Duration::from_secs(4)))
    );
    assert!(crate::args::parse::<BarrierTestArgs>(&["--rounds=1", "--late-rank=1"]).is_err());
}
