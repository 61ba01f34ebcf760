use super::*;

#[test]
fn encodes_and_decodes() {
    let me = NodeIdentity::local();
    assert_eq!(NodeIdentity::decode(&me.encode()), Some(me.clone()));
    assert_eq!(NodeIdentity::decode("1"), None);
    assert_eq!(NodeIdentity::decode("node1;pid=x"), None);
    assert!(me.ipc_ns != 0 && me.shm_ino != 0, "{me:?}");
    assert_eq!(me.reach(&me), Reach::Mappable { pids: true });
}

#[test]
fn tells_hosts_containers_and_pid_namespaces_apart() {
    let me = NodeIdentity::local();
    let other_host = NodeIdentity {
        host_name: "nodeb".into(),
        boot_id: "another-boot".into(),
        ..me.clone()
    };
    let Reach::Unmappable(m) = me.reach(&other_host) else {
        panic!("another host is mappable");
    };
    assert!(
        m.contains("another host") && m.contains("node-local"),
        "{m}"
    );
    let container = NodeIdentity {
        ipc_ns: me.ipc_ns + 1,
        shm_dev: me.shm_dev + 1,
        ..me.clone()
    };
    let Reach::Unmappable(m) = me.reach(&container) else {
        panic!("a container with its own IPC namespace is mappable");
    };
    assert!(m.contains("--ipc=host") && m.contains("/dev/shm"), "{m}");
    assert!(m.contains("IPC namespace"), "{m}");
    let pid_ns = NodeIdentity {
        pid_ns: me.pid_ns + 1,
        ..me.clone()
    };
    assert_eq!(me.reach(&pid_ns), Reach::Mappable { pids: false });
}

#[test]
fn dead_processes_are_told_only_where_pids_mean_something() {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    let dead = PeerProcess {
        rank: 3,
        pid,
        checkable: true,
    };
    assert!(dead.is_dead());
    assert!(
        dead.describe().contains("has exited"),
        "{}",
        dead.describe()
    );
    assert!(!PeerProcess {
        checkable: false,
        ..dead
    }
    .is_dead());
    let me = PeerProcess {
        rank: 0,
        pid: std::process::id(),
        checkable: true,
    };
    assert!(!me.is_dead());
}
