use super::*;
use crate::names::{abstract_name, socket_path};

fn me() -> LocalIdentity {
    LocalIdentity {
        pid: 100,
        boot_id: "boot-a".into(),
        net_ns: 4026531840,
        pid_ns: 4026531836,
    }
}

fn record(who: LocalIdentity) -> PeerRecord {
    PeerRecord {
        nonce: 0xfeed,
        secret: Secret(0x1234_5678_9abc_def0_0fed_cba9_8765_4321),
        abstract_name: abstract_name("job;1", 2, 0xfeed),
        path: socket_path(Path::new("/tmp"), "job;1", 2, (who.pid, who.pid_ns), 0xfeed),
        who,
        ptracer: PtracerState::Any,
    }
}

const ALL: &[Rung] = &[Rung::Abstract, Rung::Path, Rung::Pidfd];

#[test]
fn records_round_trip_with_awkward_values() {
    let mut r = record(me());
    assert_eq!(PeerRecord::decode(&r.encode()), Some(r.clone()));
    r.who.boot_id = "a;b=c%d".into();
    r.path = Err("cannot create /x;y: Permission denied (os error 13)".into());
    r.ptracer = PtracerState::Refused;
    assert_eq!(PeerRecord::decode(&r.encode()), Some(r.clone()));
    let text = r.encode();
    assert!(
        text.contains("secret=123456789abcdef00fedcba987654321"),
        "{text}"
    );
    assert!(
        !format!("{r:?}").contains("123456789abcdef"),
        "Debug hides the secret"
    );
    // A record without its secret (an older version's) is not one of this version.
    let without: String = text
        .split(';')
        .filter(|f| !f.starts_with("secret="))
        .collect::<Vec<_>>()
        .join(";");
    assert_eq!(PeerRecord::decode(&without), None);
    assert_eq!(
        PeerRecord::decode(&text.replace("fdpass2", "fdpass1")),
        None
    );
    assert_eq!(PeerRecord::decode("fdpass2;pid=1"), None);
    assert_eq!(PeerRecord::decode("fdpass1;pid=x"), None);
    assert_eq!(PeerRecord::decode("fdpass1;pid=1"), None);
}

#[test]
fn abstract_only_in_the_same_network_namespace() {
    let same = record(me());
    let (routes, out) = socket_routes(&me(), &same, ALL);
    assert_eq!(
        routes,
        vec![
            Route::Abstract(same.abstract_name.clone()),
            Route::Path(same.path.clone().unwrap())
        ]
    );
    assert!(out.is_empty());
    assert_eq!(pidfd_gate(&me(), &same), None);

    let other_net = record(LocalIdentity { net_ns: 1, ..me() });
    let (routes, out) = socket_routes(&me(), &other_net, ALL);
    assert_eq!(routes, vec![Route::Path(other_net.path.clone().unwrap())]);
    assert_eq!(out.len(), 1);
    assert!(matches!(out[0].2, Gate::OtherNetNamespace { there: 1, .. }));

    let other_pids = record(LocalIdentity { pid_ns: 5, ..me() });
    assert!(matches!(
        pidfd_gate(&me(), &other_pids),
        Some(Gate::OtherPidNamespace { there: 5, .. })
    ));

    let other_host = record(LocalIdentity {
        boot_id: "boot-b".into(),
        ..me()
    });
    let (routes, out) = socket_routes(&me(), &other_host, ALL);
    assert!(routes.is_empty());
    assert!(out.iter().all(|(_, _, g)| *g == Gate::OtherHost));
    assert_eq!(pidfd_gate(&me(), &other_host), Some(Gate::OtherHost));
}

#[test]
fn disabled_rungs_and_missing_paths_are_reported() {
    let mut r = record(me());
    r.path = Err("no directory".into());
    let (routes, out) = socket_routes(&me(), &r, &[Rung::Path, Rung::Pidfd]);
    assert!(routes.is_empty());
    assert_eq!(
        out[0],
        (
            Rung::Abstract,
            format!("@{}", r.abstract_name),
            Gate::Disabled
        )
    );
    assert_eq!(out[1].2, Gate::NoPath("no directory".into()));
}

/// A socket file at `path`, left behind as a killed process leaves it.
fn leftover_socket(path: &Path) {
    drop(std::os::unix::net::UnixListener::bind(path).unwrap());
    assert!(std::fs::symlink_metadata(path)
        .unwrap()
        .file_type()
        .is_socket());
}

fn temp_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nvfipc-{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const NOBODY: u32 = 65534;

#[test]
fn dead_owners_sockets_are_reclaimed_live_ones_and_others_files_kept() {
    let dir = temp_dir("naming");
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let ns = me().pid_ns;
    let live = LocalIdentity::current();
    let uid = crate::os::fd_passing::effective_uid();
    let dead_id = (dead, live.pid_ns);
    let dead_path = socket_path(&dir, "j", 0, dead_id, 1).unwrap();
    let live_path = socket_path(&dir, "j", 1, (live.pid, live.pid_ns), 1).unwrap();
    let other_ns = socket_path(&dir, "j", 2, (dead, ns), 1).unwrap();
    // Named like a dead process's socket, but a regular file, a symlink, or (when this runs
    // as root, as in CI) another user's socket: none of them is ours to remove.
    let plain = socket_path(&dir, "j", 3, dead_id, 1).unwrap();
    let link = socket_path(&dir, "j", 4, dead_id, 1).unwrap();
    let theirs = socket_path(&dir, "j", 5, dead_id, 1).unwrap();
    for p in [&dead_path, &live_path, &other_ns, &theirs] {
        leftover_socket(p);
    }
    std::fs::write(&plain, b"").unwrap();
    std::os::unix::fs::symlink(&dead_path, &link).unwrap();
    let chowned = uid == 0 && std::os::unix::fs::chown(&theirs, Some(NOBODY), None).is_ok();
    let removed = reclaim_dead_sockets(&dir, live.pid_ns, uid);
    let other_ns_kept = live.pid_ns != ns;
    assert_eq!(
        removed,
        1 + usize::from(!other_ns_kept) + usize::from(!chowned)
    );
    assert!(!dead_path.exists() && live_path.exists());
    assert_eq!(other_ns.exists(), other_ns_kept);
    assert!(plain.exists(), "a regular file is not a socket");
    assert!(link.symlink_metadata().is_ok(), "a symlink is not followed");
    if chowned {
        assert!(theirs.exists(), "another uid's socket is kept");
    } else {
        println!("(not root: the other-uid case is not checked)");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn socket_files_go_where_only_their_owner_can_enter() {
    let uid = crate::os::fd_passing::effective_uid();
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    let set =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();

    // A private directory (as $XDG_RUNTIME_DIR is) is used as it is.
    let own = temp_dir("private");
    set(&own, 0o700);
    assert_eq!(private_socket_dir(&own, uid).unwrap(), own);

    // A shared one (as /tmp is) gets a subdirectory of this uid, 0700.
    let shared = temp_dir("shared");
    set(&shared, 0o1777);
    let sub = private_socket_dir(&shared, uid).unwrap();
    assert_eq!(sub, shared.join(format!("nvfipc-{uid}")));
    assert_eq!(mode(&sub), 0o700);
    // Found again; narrowed back to 0700 if someone widened it.
    set(&sub, 0o755);
    assert_eq!(private_socket_dir(&shared, uid).unwrap(), sub);
    assert_eq!(mode(&sub), 0o700);

    // A missing directory is created 0700 and used.
    let missing = own.join("a/b");
    assert_eq!(private_socket_dir(&missing, uid).unwrap(), missing);
    assert_eq!(mode(&missing), 0o700);

    // Planted by someone else in the shared directory: a symlink, a file, a directory of
    // another uid. None is used, none is removed.
    std::fs::remove_dir(&sub).unwrap();
    std::os::unix::fs::symlink(&own, &sub).unwrap();
    let e = private_socket_dir(&shared, uid).unwrap_err();
    assert!(
        e.contains("not a directory") && e.contains("NVFIPC_SOCKET_DIR"),
        "{e}"
    );
    assert!(sub.symlink_metadata().unwrap().file_type().is_symlink());
    std::fs::remove_file(&sub).unwrap();
    std::fs::write(&sub, b"").unwrap();
    assert!(private_socket_dir(&shared, uid).is_err());
    std::fs::remove_file(&sub).unwrap();
    if uid == 0 {
        std::fs::create_dir(&sub).unwrap();
        set(&sub, 0o777);
        std::os::unix::fs::chown(&sub, Some(NOBODY), Some(NOBODY)).unwrap();
        let e = private_socket_dir(&shared, uid).unwrap_err();
        assert!(e.contains("belongs to uid 65534"), "{e}");
        assert_eq!(mode(&sub), 0o777, "not touched");
    }
    // What it refuses becomes the record's path error; the socket name there stays short.
    let e = private_socket_dir(&own.join("f"), uid);
    assert!(e.is_ok());
    std::fs::write(own.join("file"), b"").unwrap();
    let e = private_socket_dir(&own.join("file"), uid).unwrap_err();
    assert!(e.contains("not a directory"), "{e}");
    let long_job = "j".repeat(200);
    let p = socket_path(
        &PathBuf::from("/tmp/nvfipc-4294967294"),
        &long_job,
        99_999,
        (4_194_304, u64::from(u32::MAX)),
        u64::MAX,
    );
    assert!(p.is_ok(), "{p:?}");
    let _ = std::fs::remove_dir_all(&own);
    let _ = std::fs::remove_dir_all(&shared);
}

#[test]
fn the_ptracer_names_are_in_discriminant_order() {
    for (i, (state, name)) in PtracerState::NAMES.iter().enumerate() {
        assert_eq!(*state as usize, i);
        assert_eq!(state.as_str(), *name);
        assert_eq!(PtracerState::parse(name), Some(*state));
    }
}
