use super::*;

#[test]
fn parses_the_runnable_field_of_loadavg() {
    assert_eq!(parse_runnable("0.03 0.66 1.18 3/412 9921\n"), Some(3));
    assert_eq!(parse_runnable("0.03 0.66"), None);
    assert!(runnable_threads().is_some_and(|r| r >= 1));
}

#[test]
fn more_ranks_than_cores_is_oversubscribed() {
    assert!(usable_cores() >= 1);
    assert!(oversubscribed(usable_cores() + 1));
}
