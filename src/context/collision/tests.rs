use super::*;

#[test]
fn moments_round_trip_and_old_values_are_ignored() {
    let now = Moment::now();
    assert_eq!(Moment::decode(now.encode().as_bytes()), Some(now));
    assert_eq!(Moment::decode(b"1"), None);
    assert_eq!(Moment::decode(b"t1;up=x"), None);
}

#[test]
fn this_process_started_before_now_but_not_before_its_start() {
    let me = super::super::claim::THIS_PROCESS.started.as_ref();
    assert!(me.is_some());
    let later = Moment {
        since_boot: Moment::now().since_boot + Duration::from_millis(20),
        ..Moment::now()
    };
    assert!(started_before(me, &later));
    let start = super::super::claim::THIS_PROCESS.started.as_ref().unwrap();
    assert!(!started_before(me, start));
    // Another host: wall clocks, with the allowed skew.
    let elsewhere = |wall: Duration| Moment {
        boot_id: "another-boot".into(),
        since_boot: Duration::ZERO,
        wall,
    };
    assert!(!started_before(me, &elsewhere(start.wall + CLOCK_SKEW / 2)));
    assert!(started_before(
        me,
        &elsewhere(start.wall + CLOCK_SKEW + Duration::from_secs(1))
    ));
}
