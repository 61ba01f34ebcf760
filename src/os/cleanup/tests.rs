use super::*;

#[test]
fn registers_and_gives_back() {
    let a = register("/nvfipc-unitcleanup-x").unwrap();
    assert_eq!(TABLE[a].state.load(Ordering::Acquire), USED);
    unregister(a);
    assert_eq!(register(&format!("/{}", "x".repeat(90))), None);
}
