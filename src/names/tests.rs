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
