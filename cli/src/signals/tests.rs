use super::*;
use std::time::Instant;

#[test]
fn a_raised_signal_is_received_once_and_timeouts_hold() {
    let signals = Signals::install(&[libc::SIGUSR2]).unwrap();
    let start = Instant::now();
    assert_eq!(signals.wait(Some(Duration::from_millis(30))).unwrap(), None);
    assert!(start.elapsed() >= Duration::from_millis(25));
    signal_hook::low_level::raise(libc::SIGUSR2).unwrap();
    assert_eq!(
        signals.wait(Some(Duration::from_secs(5))).unwrap(),
        Some(libc::SIGUSR2)
    );
    assert_eq!(signals.wait(Some(Duration::ZERO)).unwrap(), None);
}
