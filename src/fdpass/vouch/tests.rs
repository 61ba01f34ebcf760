use super::*;
use crate::fdpass::PtracerState;

fn record(pid: u32, pid_ns: u64) -> PeerRecord {
    let mut who = LocalIdentity::current();
    who.pid = pid;
    who.pid_ns = pid_ns;
    PeerRecord {
        who,
        nonce: 1,
        secret: super::super::frame::Secret(7),
        abstract_name: "x".into(),
        path: Err("none".into()),
        ptracer: PtracerState::Refused,
    }
}

fn cred(pid: u32, uid: u32) -> sys::PeerCred {
    sys::PeerCred { pid, uid, gid: 0 }
}

#[test]
fn a_responder_of_another_uid_is_refused_whatever_the_record_says() {
    let local = LocalIdentity::current();
    let trusted = TrustedUids::from_lookup(1000, |_| None).unwrap();
    let rec = record(42, local.pid_ns);
    let err = check_responder(cred(42, 1001), &rec, &local, &trusted).unwrap_err();
    assert!(
        matches!(&err, Gate::Untrusted(m) if m.contains("uid 1001")),
        "{err:?}"
    );
    check_responder(cred(42, 1000), &rec, &local, &trusted).unwrap();
}

#[test]
fn trusted_uids_admit_the_listed_users() {
    let local = LocalIdentity::current();
    let trusted = TrustedUids::from_lookup(1000, |_| Some("1001, 1002".to_string())).unwrap();
    let rec = record(42, local.pid_ns);
    check_responder(cred(42, 1002), &rec, &local, &trusted).unwrap();
    assert!(check_responder(cred(42, 1003), &rec, &local, &trusted).is_err());
}

#[test]
fn another_pid_of_the_uid_is_refused_where_pids_compare() {
    let local = LocalIdentity::current();
    let trusted = TrustedUids::from_lookup(1000, |_| None).unwrap();
    let err =
        check_responder(cred(43, 1000), &record(42, local.pid_ns), &local, &trusted).unwrap_err();
    assert!(
        matches!(&err, Gate::Untrusted(m) if m.contains("pid 43")),
        "{err:?}"
    );
    // Another pid namespace: pids do not compare (the kernel shows 0 or a translated pid).
    check_responder(
        cred(43, 1000),
        &record(42, local.pid_ns + 1),
        &local,
        &trusted,
    )
    .unwrap();
    check_responder(cred(0, 1000), &record(42, local.pid_ns), &local, &trusted).unwrap();
}

#[test]
fn this_process_is_of_a_trusted_uid_and_pid_1s_owner_is_read() {
    let trusted = TrustedUids::own();
    process(std::process::id(), &trusted).unwrap();
    let other = TrustedUids::from_lookup(trusted.own_uid().wrapping_add(1), |_| None).unwrap();
    let err = process(std::process::id(), &other).unwrap_err();
    assert!(
        matches!(&err, Gate::Untrusted(m) if m.contains("runs as uid")),
        "{err:?}"
    );
}
