use super::*;

fn fake() -> ContiguousView {
    let layout = crate::transport::view::Layout {
        members: 2,
        stride: 4096,
        lead: 0,
    };
    ContiguousView::new(0x1000, layout, ())
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
        view: fake(),
    });
    t.record("w", call(0x10, &[0, 1]));
    assert_eq!(t.views(), 1, "same buffer and group");
    t.record("w", call(0x20, &[0, 1]));
    assert_eq!(t.views(), 0, "another buffer");
    t.get_mut("w").unwrap().view = Some(HeldView {
        ids: Vec::new(),
        view: fake(),
    });
    t.record("w", call(0x20, &[0, 2]));
    assert_eq!(t.views(), 0, "another group");
    assert!(t.remove("w").is_some());
    assert!(t.remove("w").is_none());
    assert!(t.get("w").is_none());
}
