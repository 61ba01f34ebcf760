use super::*;

#[test]
fn subsystems_round_trip_names_and_targets() {
    for s in Subsystem::ALL {
        assert_eq!(Subsystem::from_name(s.name()), Some(s));
        assert_eq!(Subsystem::from_target(s.target()), Some(s));
        assert_ne!(s.bit() & Subsystem::ALL_MASK, 0);
    }
    assert_eq!(Subsystem::from_target("mio::poll"), None);
    assert_eq!(Subsystem::ALL_MASK, 0b11_1111);
}

#[test]
fn durations_in_short_units() {
    use std::time::Duration;
    assert_eq!(took(Duration::from_nanos(33_500)), "33.5us");
    assert_eq!(took(Duration::from_micros(12_345)), "12.3ms");
    assert_eq!(took(Duration::from_micros(2_500_522)), "2500.5ms");
    assert_eq!(took(Duration::from_secs(25)), "25.00s");
}
