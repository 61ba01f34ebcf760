use super::*;

fn map(entries: &[(&str, &[u64])]) -> BTreeMap<String, Vec<u64>> {
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

// The symmetric scenario's report.

#[test]
fn rows_phases_json_chart_and_target() {
    let results = vec![
        (
            2,
            map(&[
                ("symm.first", &[100, 120]),
                ("symm.hit", &[5, 6]),
                ("symm.phase.fetch", &[40, 50]),
                ("symm.phase.claim", &[0, 0]),
            ]),
        ),
        (
            8,
            map(&[
                ("symm.first", &[700, 1400, 900]),
                ("symm.hit", &[9]),
                ("symm.first_cpu", &[70, 140, 210]),
                ("symm.first_contact", &[5000]),
            ]),
        ),
        (16, map(&[("symm.first", &[1500])])),
    ];
    let r = Row::of(8, &results[1].1);
    assert_eq!(r.first, Some(900));
    assert_eq!(r.slowest, Some(1400));
    assert_eq!(r.per_peer, Some(900 / 7));
    assert_eq!(r.cpu_per_peer, Some(20));
    assert_eq!(phases(&results[0].1, "symm.phase"), vec![("fetch", 40, 50)]);
    let text = symmetric_text(&results, "host", 3);
    assert!(text.contains("fetch 40 ns (50 ns)"), "{text}");
    let rows = symmetric_json(&results);
    assert_eq!(rows[1]["first_slowest_ns"], 1400);
    assert_eq!(rows[0]["first_phases"]["fetch"]["max_ns"], 50);
    assert!(symmetric_chart(&results, "host").contains("<polyline"));
    let targets = symmetric_target(&results);
    assert_eq!(targets.len(), 1, "no floor measured: no floor target");
    let t = &targets[0];
    assert!(
        t.name.contains("W=8") && t.name.contains("W=2"),
        "{}",
        t.name
    );
    let ratio = t.ratio.unwrap();
    assert!((ratio - (128.0 / 100.0)).abs() < 1e-9, "{ratio}");
    assert!(symmetric_target(&results[..1]).is_empty());
}

#[test]
fn the_first_contact_is_set_against_its_floor() {
    let mut map = Samples::new();
    map.insert("symm.first_contact".into(), vec![3000, 3200, 3400]);
    map.insert("symm.floor".into(), vec![1000, 1100, 1200]);
    map.insert("symm.contact_phase.setup".into(), vec![100, 200, 300]);
    map.insert("symm.contact_driver.import".into(), vec![700, 800, 900]);
    map.insert("symm.contact_calls.import".into(), vec![7, 7, 6]);
    map.insert("symm.floor_part.map".into(), vec![20, 30, 40]);
    let results = vec![(4, map.clone()), (8, map)];
    let targets = symmetric_target(&results);
    let t = targets.iter().find(|t| t.name.contains("floor")).unwrap();
    assert!(t.name.contains("W=8"), "{}", t.name);
    assert!((t.ratio.unwrap() - 3200.0 / 1100.0).abs() < 1e-9);
    assert_eq!(t.met, Some(false));
    let text = symmetric_text(&results, "device", 3);
    assert!(text.contains("2.91x"), "{text}");
    assert!(text.contains("setup 200 ns (300 ns)"), "{text}");
    assert!(text.contains("import 800 ns (900 ns)"), "{text}");
    assert!(text.contains("map 30 ns (40 ns)"), "{text}");
    assert!(text.contains("driver calls of the first contact (most on one rank): import 7"));
    let rows = symmetric_json(&results);
    assert_eq!(rows[1]["floor_median_ns"], 1100);
    assert_eq!(rows[1]["first_contact_driver"]["import"]["median_ns"], 800);
}
