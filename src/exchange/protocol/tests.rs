use super::*;

#[test]
fn key_lists_are_bounded() {
    assert_eq!(some_keys(&["a", "b"], 4), "\"a\", \"b\"");
    assert_eq!(some_keys(&["a", "b", "c"], 2), "\"a\", \"b\", and 1 more");
    assert_eq!(some_keys::<&str>(&[], 2), "");
}
