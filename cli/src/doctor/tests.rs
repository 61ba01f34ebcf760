use super::*;

#[test]
fn the_report_has_one_line_per_check_and_a_fix_under_it() {
    let header = Header {
        host: "vm".into(),
        pid: 7,
        job: Some((1, 2, "j".into())),
    };
    let checks = vec![
        Check::new("host", "a", Verdict::Pass).detail("fine"),
        Check::new("cuda", "b", Verdict::CannotCheck)
            .detail("no driver")
            .fix("install it"),
    ];
    let text = text_report(&header, &checks);
    assert!(text.starts_with("nvfipc doctor "), "{text}");
    assert!(text.contains("rank 1 of 2 (job j)"), "{text}");
    assert!(text.contains("pass         host: a: fine\n"), "{text}");
    assert!(
        text.contains("cannot check cuda: b: no driver\n             -> install it\n"),
        "{text}"
    );
    assert!(
        text.ends_with("2 checks: 1 pass, 0 warn, 0 fail, 1 cannot check\n"),
        "{text}"
    );
    let v = json_report(&header, &checks);
    assert_eq!(v["ok"], true);
    assert_eq!(v["checks"][1]["verdict"], "cannot check");
    assert_eq!(v["summary"]["cannot_check"], 1);
}

#[test]
fn options_parse() {
    let a: DoctorArgs = crate::args::parse(&["--json", "--timeout-ms", "500"]).unwrap();
    assert!(a.json && !a.local);
    assert_eq!(a.timeout, Duration::from_millis(500));
}
