use super::*;

struct Fake;
impl ContiguousView for Fake {
    fn base(&self) -> u64 {
        0x1000
    }
    fn stride(&self) -> u64 {
        4096
    }
}

fn call(ptr: u64, members: &[usize]) -> Rendezvous {
    Rendezvous {
        kind: MemKind::Host,
        ptr,
        bytes: 64,
        members: members.to_vec(),
        view: None,
    }
}

#[test]
fn a_view_survives_only_the_same_call() {
    let mut t = SymmetricTable::default();
    t.record("w", call(0x10, &[0, 1]));
    t.get_mut("w").unwrap().view = Some(HeldView {
        ids: Vec::new(),
        view: Box::new(Fake),
    });
    t.record("w", call(0x10, &[0, 1]));
    assert_eq!(t.views(), 1, "same buffer and group");
    t.record("w", call(0x20, &[0, 1]));
    assert_eq!(t.views(), 0, "another buffer");
    t.get_mut("w").unwrap().view = Some(HeldView {
        ids: Vec::new(),
        view: Box::new(Fake),
    });
    t.record("w", call(0x20, &[0, 2]));
    assert_eq!(t.views(), 0, "another group");
    assert!(t.remove("w").is_some());
    assert!(t.remove("w").is_none());
    assert!(t.get("w").is_none());
}
