use super::*;
use crate::bench::report::phases;
use crate::bench::report::tests::map;

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
    let text = text(&results, "host", 3);
    assert!(text.contains("fetch 40 ns (50 ns)"), "{text}");
    let rows = json(&results);
    assert_eq!(rows[1]["first_slowest_ns"], 1400);
    assert_eq!(rows[0]["first_phases"]["fetch"]["max_ns"], 50);
    assert!(chart(&results, "host").contains("<polyline"));
    let found = targets(&results);
    assert_eq!(found.len(), 1, "no floor measured: no floor target");
    let t = &found[0];
    assert!(
        t.name.contains("W=8") && t.name.contains("W=2"),
        "{}",
        t.name
    );
    let ratio = t.ratio.unwrap();
    assert!((ratio - (128.0 / 100.0)).abs() < 1e-9, "{ratio}");
    assert!(targets(&results[..1]).is_empty());
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
    let found = targets(&results);
    let t = found.iter().find(|t| t.name.contains("floor")).unwrap();
    assert!(t.name.contains("W=8"), "{}", t.name);
    assert!((t.ratio.unwrap() - 3200.0 / 1100.0).abs() < 1e-9);
    assert_eq!(t.met, Some(false));
    let text = text(&results, "device", 3);
    assert!(text.contains("2.91x"), "{text}");
    assert!(text.contains("setup 200 ns (300 ns)"), "{text}");
    assert!(text.contains("import 800 ns (900 ns)"), "{text}");
    assert!(text.contains("map 30 ns (40 ns)"), "{text}");
    assert!(text.contains("driver calls of the first contact (most on one rank): import 7"));
    let rows = json(&results);
    assert_eq!(rows[1]["floor_median_ns"], 1100);
    assert_eq!(rows[1]["first_contact_driver"]["import"]["median_ns"], 800);
}
