use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

struct Flag(AtomicBool, &'static str);

impl Presence for Flag {
    fn left(&self) -> Option<String> {
        self.0.load(Ordering::SeqCst).then(|| self.1.to_string())
    }
}

#[test]
fn every_other_rank_must_be_seen_leaving() {
    let job = "departures-unit-test-job";
    assert_eq!(all_left(job, 0), None, "unknown job");
    note_world(job, 3);
    let one = Arc::new(Flag(AtomicBool::new(true), "rank 1 left"));
    note_peer(job, 1, one.clone());
    assert_eq!(all_left(job, 0), None, "rank 2 was never seen");
    let two = Arc::new(Flag(AtomicBool::new(false), "rank 2 left"));
    note_peer(job, 2, two.clone());
    assert_eq!(all_left(job, 0), None, "rank 2 is still there");
    two.0.store(true, Ordering::SeqCst);
    assert_eq!(
        all_left(job, 0),
        Some(vec!["rank 1 left".to_string(), "rank 2 left".to_string()])
    );
    // A newer presence of a rank replaces the older one.
    note_peer(job, 1, Arc::new(Flag(AtomicBool::new(false), "")));
    assert_eq!(all_left(job, 0), None);
    // A world of one has no peer that could be seen leaving.
    note_world("departures-unit-test-alone", 1);
    assert_eq!(all_left("departures-unit-test-alone", 0), None);
}

#[test]
fn a_store_that_is_there_is_used_one_that_is_gone_never() {
    let job = "departures-unit-test-quiet";
    note_world(job, 2);
    let peer = Arc::new(Flag(AtomicBool::new(false), "rank 1 left"));
    note_peer(job, 1, peer.clone());
    assert_eq!(quiet_reason(Liveness::Unknown, job, 0), None);
    assert!(quiet_reason(Liveness::Gone, job, 0)
        .unwrap()
        .contains("closed the connection"));
    peer.0.store(true, Ordering::SeqCst);
    assert!(quiet_reason(Liveness::Unknown, job, 0)
        .unwrap()
        .contains("rank 1 left"));
    assert_eq!(quiet_reason(Liveness::Alive, job, 0), None);
}

#[test]
fn rank_zero_leaving_is_enough_for_a_store_that_cannot_tell() {
    let job = "departures-unit-test-host";
    note_world(job, 4);
    let zero = Arc::new(Flag(AtomicBool::new(false), "rank 0 left"));
    note_peer(job, 0, zero.clone());
    // Rank 1 never saw ranks 2 and 3 (no exchange with them).
    assert_eq!(quiet_reason(Liveness::Unknown, job, 1), None);
    zero.0.store(true, Ordering::SeqCst);
    let why = quiet_reason(Liveness::Unknown, job, 1).expect("rank 0 has left");
    assert!(
        why.contains("rank 0 left") && why.contains("rank 0, which hosts"),
        "{why}"
    );
    // Rank 0 itself decides by every other rank, and a store that is there is used.
    note_peer(job, 1, Arc::new(Flag(AtomicBool::new(false), "")));
    assert_eq!(quiet_reason(Liveness::Unknown, job, 0), None);
    assert_eq!(quiet_reason(Liveness::Alive, job, 1), None);
}
