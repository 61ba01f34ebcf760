use super::*;

#[test]
fn off_by_default_and_charges_each_phase_when_on() {
    let clock = PhaseClock::default();
    assert!(clock.start().is_none());
    clock.set_enabled(true);
    let mut lap = clock.start();
    std::thread::sleep(std::time::Duration::from_millis(2));
    mark(&mut lap, Phase::WaitPeers);
    mark(&mut lap, Phase::Commit);
    lap.unwrap().finish();
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
