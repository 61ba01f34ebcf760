use super::*;

#[test]
fn peers_are_checked_for_liveness_only_past_the_spin_phase() {
    assert!(!(0..FIRST_LIVENESS_POLL).any(liveness_check_due));
    assert!(liveness_check_due(FIRST_LIVENESS_POLL));
    assert!(!liveness_check_due(FIRST_LIVENESS_POLL + 1));
    assert!(liveness_check_due(FIRST_LIVENESS_POLL + LIVENESS_EVERY));
}
