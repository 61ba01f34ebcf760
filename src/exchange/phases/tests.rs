use super::*;

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
