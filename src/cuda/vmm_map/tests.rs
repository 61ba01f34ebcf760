use super::*;

#[test]
fn a_run_inside_a_mapped_run_is_found_at_its_offset() {
    let held = [(10, 2 << 20), (11, 2 << 20), (12, 20 << 20)];
    assert_eq!(offset_within(&held, &[10]), Some(0));
    assert_eq!(offset_within(&held, &[11, 12]), Some(2 << 20));
    assert_eq!(offset_within(&held, &[12]), Some(4 << 20));
    assert_eq!(offset_within(&held, &[10, 12]), None, "not back to back");
    assert_eq!(
        offset_within(&held, &[12, 13]),
        None,
        "runs past the mapping"
    );
    assert_eq!(offset_within(&held, &[]), None);
    assert_eq!(offset_within(&held[..1], &[10, 11]), None);
}
