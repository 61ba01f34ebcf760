use super::*;

fn map(entries: &[(&str, &[u64])]) -> Samples {
    entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect()
}

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
    let t = symmetric_target(&results).unwrap();
    assert!(
        t.name.contains("W=8") && t.name.contains("W=2"),
        "{}",
        t.name
    );
    let ratio = t.ratio.unwrap();
    assert!((ratio - (128.0 / 100.0)).abs() < 1e-9, "{ratio}");
    assert!(symmetric_target(&results[..1]).is_none());
}
