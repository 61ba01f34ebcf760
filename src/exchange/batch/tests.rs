use super::*;

#[test]
fn peers_are_checked_for_liveness_only_past_the_spin_phase() {
    assert!(!(0..FIRST_LIVENESS_POLL).any(liveness_check_due));
    assert!(liveness_check_due(FIRST_LIVENESS_POLL));
    assert!(!liveness_check_due(FIRST_LIVENESS_POLL + 1));
    assert!(liveness_check_due(FIRST_LIVENESS_POLL + LIVENESS_EVERY));
}

#[test]
fn the_deadline_starts_at_its_first_use_and_then_holds() {
    let mut d = Deadline::new(Duration::from_secs(60));
    assert!(d.at.is_none());
    let first = d.remaining();
    assert!(first > Duration::from_secs(59) && first <= Duration::from_secs(60));
    let at = d.at.expect("set by the first use");
    std::thread::sleep(Duration::from_millis(2));
    assert!(d.remaining() < first);
    assert_eq!(d.at, Some(at));
    assert_eq!(d.timeout, Duration::from_secs(60));
    assert_eq!(Deadline::new(Duration::ZERO).remaining(), Duration::ZERO);
}

#[test]
fn key_lists_are_bounded() {
    assert_eq!(some_keys(&["a", "b"], 4), "\"a\", \"b\"");
    assert_eq!(some_keys(&["a", "b", "c"], 2), "\"a\", \"b\", and 1 more");
    assert_eq!(some_keys::<&str>(&[], 2), "");
}
