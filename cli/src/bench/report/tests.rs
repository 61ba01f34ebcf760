use super::*;

/// A run's samples from literal series (for this module's tests and the symmetric report's).
pub(super) fn map(entries: &[(&str, &[u64])]) -> BTreeMap<String, Vec<u64>> {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect()
}

#[test]
fn the_pool_target_is_looser_where_ranks_outnumber_cores() {
    assert_eq!(pool_limit(8, 16).0, 0.05);
    assert_eq!(pool_limit(8, 2).0, 0.25);
    assert!(pool_limit(8, 2).1.contains("8 ranks on 2 cores"));
}

#[test]
fn the_phases_of_pool_and_cold_large_are_reported_where_measured() {
    let mut r = Results::new(false);
    r.exchange.push((
        4,
        map(&[
            ("ours.pool", &[20]),
            ("ours.pool.phase.wait_peers", &[2_000, 3_000, 9_000]),
            ("ours.pool.store_round_trips", &[0, 0, 0]),
            ("ours.cold_large", &[900]),
            ("ours.cold_large.phase.import", &[500_000, 700_000]),
            ("ours.cold_large.store_round_trips", &[2, 2]),
        ]),
    ));
    let text = r.text();
    assert!(
        text.contains("pool at W=4, where a call's time goes")
            && text.contains("wait_peers 3.0 us (9.0 us)")
            && text.contains("all ranks: 0"),
        "{text}"
    );
    assert!(
        text.contains("cold_large at W=4, where a call's time goes")
            && text.contains("all ranks: 4"),
        "{text}"
    );
    // The warm call's phases come from a pass of their own, its p50 beside the timed pass's.
    r.exchange[0].1.insert("ours.warm".into(), vec![1_400]);
    r.exchange[0]
        .1
        .insert("ours.warm_phased".into(), vec![1_700]);
    r.exchange[0]
        .1
        .insert("ours.warm_phased.phase.resolve".into(), vec![300, 500]);
    let text = r.text();
    assert!(
        text.contains(
            "warm (a second pass with phase timing on, p50 1.7 us against the timed pass's \
             1.4 us) at W=4, where a call's time goes"
        ) && text.contains("resolve 300 ns (500 ns)"),
        "{text}"
    );
    // A scenario without phases has no such line.
    r.exchange[0]
        .1
        .retain(|k, _| !k.starts_with("ours.cold_large."));
    assert!(!r.text().contains("cold_large at W=4, where"));
}

#[test]
fn targets_compare_the_largest_world() {
    let mut r = Results::new(false);
    r.exchange.push((2, map(&[("ours.cold", &[1])])));
    r.exchange.push((
        8,
        map(&[
            ("ours.cold", &[100, 100]),
            ("seed.cold", &[400]),
            ("ours.cold_large", &[200]),
            ("seed.cold_large", &[500]),
            ("floor_large.opens", &[100]),
            ("floor_large.rtt", &[20]),
            ("ours.warm", &[1500]),
            ("ours.asym", &[150]),
            ("ours.pool", &[20]),
            ("seed.pool", &[400]),
            ("ours.pool.opens", &[0, 0]),
            ("seed.pool.opens", &[1, 0]),
            ("floor.opens", &[40]),
            ("floor.rtt", &[15]),
        ]),
    ));
    r.barrier.push((
        64,
        map(&[("barrier.ours", &[10]), ("barrier.torch_style", &[30])]),
    ));
    let t = r.targets();
    let verdicts: Vec<(String, Option<bool>)> = t.iter().map(|t| (t.name.clone(), t.met)).collect();
    assert_eq!(verdicts[0].1, Some(true), "{verdicts:?}"); // cold_large 200/500 = 0.4
    assert_eq!(verdicts[1].1, Some(true)); // 200 / (100 + 2 * 20) = 1.43
    assert_eq!(verdicts[2].1, Some(true)); // small cold 100/400
    assert_eq!(verdicts[3].1, Some(true)); // 1.5 us
    assert_eq!(verdicts[4].1, Some(false)); // asym 150 > cold 100
    assert_eq!(verdicts[5].1, Some(true)); // pool 20/400 = 0.05
    assert_eq!(verdicts[6].1, None, "no pool at W=2 in this run");
    assert_eq!(verdicts[7].1, None, "no store counts in this run");
    assert_eq!(verdicts[8].1, Some(true)); // 10/30
    assert!(r.text().contains("MISSED"));
    assert!(r
        .text()
        .contains("pool at W=8: IPC opens during the timed calls, all ranks: ours 0, seed 1"));
    assert!(r.json_text().contains("\"floor_ns\": 70"));
    r.post = Some(map(&[
        ("post.channel", &[400, 900]),
        ("post.request", &[2500]),
    ]));
    r.post_transport = "host".into();
    let post = r.targets().pop().unwrap();
    assert!(post.name.contains("opened channel"), "{}", post.name);
    assert_eq!(post.met, Some(true)); // median of 400 and 900 <= 1 us
    assert!(r.text().contains("cache + request"));
    assert!(r.json_text().contains("\"p99_ns\": 2500"));
    assert_eq!(r.charts().len(), 2);
}
