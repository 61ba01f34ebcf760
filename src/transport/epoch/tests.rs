use super::*;

#[test]
fn values_interleave_and_start_after_zero() {
    assert_eq!(done(0), 0);
    assert_eq!(posted(1), 1);
    assert_eq!(done(1), 2);
    assert_eq!(posted(2), 3);
    assert!(!reached(0, posted(1)));
    assert!(reached(posted(1), posted(1)));
    assert!(!reached(posted(1), done(1)));
}

#[test]
fn later_signals_satisfy_earlier_waits() {
    // A sender that posted transfer 3 before the receiver waited for transfer 2.
    assert!(reached(posted(3), posted(2)));
    assert!(reached(done(5), done(4)));
    assert!(!reached(done(4), done(5)));
}

#[test]
fn wraps_around() {
    let n = (1u64 << 31) + 5; // values wrap past u32::MAX
    assert!(reached(posted(n + 1), posted(n)));
    assert!(reached(done(n), posted(n)));
    assert!(!reached(posted(n), done(n)));
    assert!(reached(posted(1u64 << 32), done((1u64 << 32) - 1)));
}

#[test]
fn counters_number_from_one() {
    let e = TransferEpochs::default();
    assert_eq!(e.last_send(), 0);
    assert_eq!(e.next_send(), 1);
    assert_eq!(e.next_send(), 2);
    assert_eq!(e.last_send(), 2);
    assert_eq!(e.next_recv(), 1);
    assert_eq!(e.last_recv(), 1);
}
