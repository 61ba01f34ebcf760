use super::*;

#[test]
fn lines_name_host_pid_thread_rank_level_and_subsystem() {
    let s = Sink {
        subsystems: AtomicU32::new(Subsystem::ALL_MASK),
        rank: AtomicI64::new(3),
        host: "node7".into(),
        pid: 42,
        file: Mutex::new(None),
        callback: RwLock::new(None),
    };
    let line = format_line(
        &s,
        Level::Info,
        Some(Subsystem::Exchange),
        super::super::EXCHANGE,
        &format_args!("peer={} step={}", 1, 5),
    );
    let (time, rest) = line.split_once(' ').unwrap();
    assert!(time.ends_with('Z') && time.contains('T'), "{line}");
    let tid = os_thread_id();
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
