use super::*;

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
