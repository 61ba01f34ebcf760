use super::*;

#[test]
fn job_tags_are_name_safe() {
    assert_eq!(job_tag("abc_1"), "abc_1");
    assert_eq!(job_tag("a/b").len(), 16);
    assert_eq!(job_tag("").len(), 16);
    assert_eq!(job_tag(&"x".repeat(40)).len(), 16);
}

#[test]
fn boards_are_told_apart_from_other_segments() {
    assert!(is_board_name(&CacheNames::new("job", "", 1).board(3)[1..]));
    assert!(is_board_name(
        &CacheNames::new("job", "sc", 2).board(12)[1..]
    ));
    assert!(!is_board_name("nvfipc-job-b"));
    assert!(!is_board_name("nvfipc-job-1n2-7"));
    assert!(!is_board_name("other-b3"));
}

#[test]
fn generations_name_apart_every_shared_name() {
    let (a, b) = (
        CacheNames::new("job", "s", 1),
        CacheNames::new("job", "s", 2),
    );
    assert_ne!(a.board(0), b.board(0));
    assert_ne!(a.node_key(0), b.node_key(0));
    let ch = (0, 1, "t", 0);
    assert_ne!(a.record_key(ch, 0, 1), b.record_key(ch, 0, 1));
    assert_ne!(a.record_key(ch, 0, 1), a.record_key(ch, 0, 2));
    assert_ne!(a.record_key(ch, 0, 1), a.record_key(ch, 1, 1));
}

#[test]
fn generations_count_per_rank_and_give_back_failed_creations() {
    let job = "gen-unit";
    let first = generations::reserve(job, "", 0);
    assert_eq!(first.generation(), 1);
    first.commit();
    // Another rank in the same process (threads as ranks) counts apart.
    assert_eq!(generations::reserve(job, "", 1).generation(), 1);
    let failed = generations::reserve(job, "", 0);
    assert_eq!(failed.generation(), 2);
    drop(failed);
    let retried = generations::reserve(job, "", 0);
    assert_eq!(retried.generation(), 2);
    retried.commit();
    assert_eq!(generations::reserve(job, "x", 0).generation(), 1);
}

#[test]
fn names_are_safe_short_and_per_job_rank_and_nonce() {
    assert_eq!(abstract_name("j", 3, 1), "nvfipc-j-3-0000000000000001");
    assert_eq!(job_in_name("a/b c"), "a_b_c");
    let long = "x".repeat(200);
    let short = job_in_name(&long);
    assert!(short.len() <= MAX_JOB_IN_NAME, "{short}");
    assert_ne!(short, job_in_name(&"x".repeat(201)));
    assert_ne!(abstract_name("j", 3, 1), abstract_name("j", 3, 2));
    assert_ne!(abstract_name("j", 3, 1), abstract_name("k", 3, 1));
    assert!(abstract_name(&long, usize::MAX, u64::MAX).len() < MAX_SOCKET_NAME);
    let p = socket_path(
        Path::new("/run/user/1000"),
        "job",
        7,
        (100, 4026531836),
        0xab,
    )
    .unwrap();
    assert_eq!(
        p,
        Path::new("/run/user/1000/nvfipc-job-7-100p4026531836-00000000000000ab.sock")
    );
    assert_eq!(
        socket_owner(&p.file_name().unwrap().to_string_lossy()),
        Some((100, 4026531836))
    );
    assert_eq!(socket_owner("nvfipc-a-b-1-2.sock"), None);
    let deep = PathBuf::from(format!("/{}", "d".repeat(90)));
    let e = socket_path(&deep, "job", 7, (100, 4026531836), 1).unwrap_err();
    assert!(e.contains("NVFIPC_SOCKET_DIR"), "{e}");
}
