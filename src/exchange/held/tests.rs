use super::*;
use crate::exchange::known::tests::rec;

#[test]
fn keeps_the_listed_records_most_recent_first_and_bounded() {
    let mut h = HeldRecords::default();
    assert_eq!(h.imported(&[], &rec(5, 0)), vec![5]);
    assert_eq!(h.imported(&[5], &rec(6, 0)), vec![6, 5]);
    // 5 was released (taken off the board's list): its record goes at the next import.
    assert!(h.record_for(5, 0, 8, 3, &rec(6, 1)).is_some());
    assert_eq!(h.imported(&[6], &rec(7, 0)), vec![7, 6]);
    assert!(h.record_for(5, 0, 8, 3, &rec(6, 1)).is_none());
    let got = h.record_for(6, 128, 64, 9, &rec(7, 4)).unwrap();
    assert_eq!(
        (got.buffer_id, got.offset, got.bytes, got.version),
        (6, 128, 64, 9)
    );
    assert_eq!(got.sem_slot, 4, "the channel's semaphore");
    // Again the same allocation: moved first, not twice.
    assert_eq!(h.imported(&[7, 6], &rec(6, 0)), vec![6, 7]);
    let mut listed = vec![6, 7];
    for id in 10..30 {
        listed = h.imported(&listed, &rec(id, 0));
    }
    assert_eq!(listed.len(), KNOWN_PER_CHANNEL);
    assert_eq!(listed[0], 29);
}
