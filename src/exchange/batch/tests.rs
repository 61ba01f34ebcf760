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

#[test]
fn off_by_default_and_charges_each_phase_when_on() {
    let clock = PhaseClock::default();
    assert!(clock.start().0.is_none());
    clock.set_enabled(true);
    let mut lap = clock.start();
    std::thread::sleep(std::time::Duration::from_millis(2));
    lap.mark(Phase::WaitPeers);
    lap.mark(Phase::Commit);
    lap.finish();
    let t = clock.snapshot();
    assert_eq!(t.calls, 1);
    assert!(t.of(Phase::WaitPeers) >= 2_000_000, "{t:?}");
    assert!(t.of(Phase::Commit) < t.of(Phase::WaitPeers));
    assert_eq!(t.of(Phase::Fetch), 0);
    clock.reset();
    assert_eq!(clock.snapshot(), PhaseTimes::default());
    assert_eq!(
        PHASES.iter().map(|p| *p as usize).collect::<Vec<_>>(),
        (0..13).collect::<Vec<_>>()
    );
}
