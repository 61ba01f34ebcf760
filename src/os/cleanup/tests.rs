use super::*;

#[test]
fn registers_and_gives_back() {
    let a = register("/nvfipc-unitcleanup-x").unwrap();
    assert_eq!(AT_EXIT.slots[a].state.load(Ordering::Acquire), USED);
    unregister(a);
    assert_eq!(register(&format!("/{}", "x".repeat(110))), None);
}
