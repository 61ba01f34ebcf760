use super::*;

#[test]
fn start_time_parses_past_odd_command_names() {
    let line = "4242 (a b) c)) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 \
                    987654 1000 10 18446744073709551615";
    assert_eq!(start_ticks(line), Some(987654));
    assert_eq!(start_ticks("4242 (x) S 1"), None);
}

#[test]
fn state_parses_past_odd_command_names() {
    assert_eq!(state_of("4242 (a b) c)) Z 1 4242"), Some('Z'));
    assert_eq!(state_of("7 (sleep) S 1"), Some('S'));
    assert_eq!(state_of("7 (sleep"), None);
}

/// A child that has exited but is not reaped yet is a zombie: not alive. Reaped, its pid
/// names nothing.
#[test]
fn an_exited_child_is_not_alive_before_it_is_reaped() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    let start = std::time::Instant::now();
    while process_alive(pid) && start.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(!process_alive(pid), "pid {pid} still alive after it exited");
    // Not reaped yet: the pid still exists (as a zombie) until `wait`.
    // SAFETY: signal 0 only checks for existence.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, 0) }, 0);
    child.wait().unwrap();
    assert!(!process_alive(pid));
    assert!(process_alive(std::process::id()));
}

#[test]
fn this_process_started_before_now_and_the_load_was_recorded() {
    assert_ne!(LOADED_AT.load(Ordering::Relaxed), 0);
    assert!(started_by().unwrap() <= since_boot().unwrap());
}

#[test]
fn cgroup_dirs_are_found_for_v2_and_v1() {
    assert_eq!(
        cgroup_dir_in("0::/user.slice/x\n", "memory").as_deref(),
        Some("/sys/fs/cgroup/user.slice/x")
    );
    assert_eq!(
        cgroup_dir_in("3:cpu,pids:/a\n0::/b\n", "pids").as_deref(),
        Some("/sys/fs/cgroup/pids/a")
    );
    assert_eq!(cgroup_dir_in("1:memory:/a\n", "pids"), None);
}

/// The load-time constructor grew the descriptor table, so no rendezvous has to.
#[test]
fn the_descriptor_table_is_grown_at_load() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out pointer for the duration of the call.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let size: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("FDSize:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap();
    assert!(size >= limit.rlim_cur.min(super::FD_TABLE_SIZE), "{size}");
}
