use super::*;

#[test]
fn the_error_names_every_rung_and_picks_a_telling_status() {
    let mut d = Diagnosis::new("rank 1: fetching fd 7 of peer rank 0 in job j");
    d.add(
        Rung::Abstract,
        "@nvfipc-j-0-1",
        Gate::OtherNetNamespace { here: 1, there: 2 },
    );
    d.add(Rung::Path, "/tmp/x.sock", Gate::PathAbsent);
    d.add(
        Rung::Pidfd,
        "pid 5 fd 9",
        Gate::PtraceDenied("Yama ptrace_scope=2 requires CAP_SYS_PTRACE".into()),
    );
    d.add(Rung::Fabric, "", Gate::Other("no IMEX channel".into()));
    assert_eq!(d.gate(Rung::Path), Some(&Gate::PathAbsent));
    let e = d.into_error();
    assert_eq!(e.status, Status::Io);
    for needle in [
        "rank 1",
        "peer rank 0",
        "job j",
        "abstract socket @nvfipc-j-0-1: different network namespace",
        "socket path /tmp/x.sock",
        "NVFIPC_SOCKET_DIR",
        "pidfd_getfd pid 5 fd 9: EPERM: Yama",
        "FABRIC handle",
    ] {
        assert!(e.message.contains(needle), "{needle}: {}", e.message);
    }

    let mut d = Diagnosis::new("x");
    d.add(Rung::Abstract, "@a", Gate::TimedOut("no reply".into()));
    d.add(
        Rung::Path,
        "/p",
        Gate::Refused {
            code: ErrorCode::Revoked,
            message: "gone".into(),
        },
    );
    assert_eq!(d.into_error().status, Status::NotFound);
    let mut d = Diagnosis::new("x");
    d.add(Rung::Abstract, "@a", Gate::Disabled);
    d.add(Rung::Path, "/p", Gate::TimedOut("no reply".into()));
    assert_eq!(d.into_error().status, Status::Timeout);
    let e = Diagnosis::new("x").into_error();
    assert!(e.message.contains("NVFIPC_FD_RUNGS"), "{}", e.message);
}

#[test]
fn eperm_is_explained_by_the_gate_that_applies() {
    let docker = PtraceFacts {
        seccomp: 2,
        cap_sys_ptrace: false,
        yama_scope: Some(1),
        my_uid: Some(1000),
        peer_uid: Some(1000),
    };
    let why = docker.explain_eperm("any");
    assert!(
        why.contains("seccomp") && why.contains("--cap-add SYS_PTRACE"),
        "{why}"
    );
    assert!(
        !why.contains("Yama"),
        "the exporter allowed any ptracer: {why}"
    );
    let why = docker.explain_eperm("refused");
    assert!(
        why.contains("ptrace_scope=1") && why.contains("ptracer=refused"),
        "{why}"
    );
    let why = PtraceFacts {
        seccomp: 0,
        yama_scope: Some(2),
        ..docker.clone()
    }
    .explain_eperm("any");
    assert!(
        why.contains("ptrace_scope=2") && !why.contains("seccomp"),
        "{why}"
    );
    let why = PtraceFacts {
        yama_scope: Some(3),
        cap_sys_ptrace: true,
        ..docker.clone()
    }
    .explain_eperm("any");
    assert!(why.contains("ptrace_scope=3"), "{why}");
    let why = PtraceFacts {
        seccomp: 0,
        yama_scope: None,
        peer_uid: Some(0),
        ..docker.clone()
    }
    .explain_eperm("unneeded");
    assert!(why.contains("uid 0") && why.contains("uid 1000"), "{why}");
    let why = PtraceFacts {
        seccomp: 0,
        yama_scope: None,
        ..docker.clone()
    }
    .explain_eperm("unneeded");
    assert!(why.contains("lacks CAP_SYS_PTRACE"), "{why}");
    let why = PtraceFacts {
        seccomp: 0,
        yama_scope: None,
        cap_sys_ptrace: true,
        ..docker
    }
    .explain_eperm("unneeded");
    assert!(why.contains("although this process holds"), "{why}");
    let me = PtraceFacts::observe(std::process::id());
    assert_eq!(me.my_uid, me.peer_uid);
}

#[test]
fn pidfd_errors_map_to_gates() {
    let g = |e: i32| pidfd_gate_of(&io::Error::from_raw_os_error(e), "any", 1);
    assert!(matches!(g(ENOSYS), Gate::NoKernelSupport(_)));
    assert_eq!(g(ESRCH), Gate::ProcessGone);
    assert!(matches!(g(EBADF), Gate::NotTheObject(_)));
    let Gate::PtraceDenied(why) = g(EPERM) else {
        panic!("EPERM is not a ptrace denial");
    };
    assert!(!why.is_empty());
    assert_eq!(Rung::parse(" pidfd"), Some(Rung::Pidfd));
    assert_eq!(Rung::parse("fabric"), Some(Rung::Fabric));
    assert_eq!(Rung::parse("tcp"), None);
}
