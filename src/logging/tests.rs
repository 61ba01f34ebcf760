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

#[test]
fn lines_name_host_pid_thread_rank_level_and_subsystem() {
    let s = Sink {
        subsystems: AtomicU32::new(Subsystem::ALL_MASK),
        rank: AtomicI64::new(3),
        host: "node7".into(),
        pid: 42,
        file: Mutex::new(None),
        callback: RwLock::new(None),
        problems: Mutex::new(Vec::new()),
    };
    let line = format_line(
        &s,
        Level::Info,
        Some(Subsystem::Exchange),
        EXCHANGE,
        &format_args!("peer={} step={}", 1, 5),
    );
    let (time, rest) = line.split_once(' ').unwrap();
    assert!(time.ends_with('Z') && time.contains('T'), "{line}");
    let tid = crate::os::process::thread_id();
    assert_eq!(
        rest,
        format!("node7:42:{tid} [rank 3] NVFIPC INFO exchange: peer=1 step=5")
    );
    s.rank.store(-1, Ordering::Relaxed);
    let line = format_line(&s, Level::Warn, None, "mio::poll", &format_args!("x"));
    assert!(
        line.ends_with(&format!("node7:42:{tid} NVFIPC WARN mio::poll: x")),
        "{line}"
    );
}
